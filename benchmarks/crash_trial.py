# Copyright (c) mmnanguard contributors. All rights reserved.
"""One crash-survival trial: train, break the run at a chosen point, resume.

A trial trains the tiny rotated RetinaNet (``configs/tiny``, generated DOTA
data, 8 images in order, ``IterBasedTrainLoop``, a checkpoint every
iteration) through ``tools/train.py``'s ``main`` in a child process, with
``--guard off`` (bare mmengine: ``Runner``) or ``--guard skip``
(``NanGuardRunner``), and breaks it at one point (:data:`TRIALS`):

* ``kill_in_save``: SIGKILL while the checkpoint of iteration
  :data:`BREAK_AT` is half written (the child writes half the bytes and
  waits; the parent kills it);
* ``kill_in_save_keep1``: the same with ``max_keep_ckpts=1``;
* ``kill_writing_last_checkpoint``: SIGKILL while ``last_checkpoint`` is
  being rewritten (bare: after ``open(..., 'w')`` truncated it);
* ``full_disk`` / ``full_disk_keep1``: ``OSError(ENOSPC)`` halfway through
  the checkpoint write;
* ``full_disk_last_checkpoint``: ``OSError(ENOSPC)`` while writing
  ``last_checkpoint``;
* ``sigterm``: SIGTERM during iteration :data:`BREAK_AT` with checkpoints
  every 100 iterations (none written yet);
* ``truncated_newest``: after a finished run of :data:`BREAK_AT`
  iterations, the newest checkpoint is cut to half (as a kill during a
  bare save, or a copy that stopped, leaves it);
* ``empty_last_checkpoint``: after a finished run, ``last_checkpoint``
  is emptied (what a bare kill between truncating and writing leaves).

Then ``tools/train.py CONFIG --resume`` runs in a fresh child, and
the trial records: which checkpoints had completed before the break (a
probe hook logs each one after its save), which of them are still on disk
and load, whether ``last_checkpoint`` is complete or absent, the resume's
exit status, the iteration it resumed at and whether its weights equal
those of the newest completed checkpoint.

Used by ``benchmarks/crash_survival.py`` and
``tests/test_integration/test_crash_survival.py``. Every child is forked
from a ``multiprocessing`` fork server that imported torch and the stack
once (a fresh process each time, without the 10 s of imports). POSIX
only (a fork server; SIGKILL of a child that waits at its break point).
"""

import argparse
import errno
import hashlib
import json
import multiprocessing
import os
import os.path as osp
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TRAIN = osp.join(REPO, 'tools', 'train.py')
TINY_DOTA = osp.join(
    REPO, 'configs', 'tiny', 'rotated-retinanet-rbox-le90_r18_tiny-dota.py'
)
#: The iteration whose checkpoint (or signal) breaks the run.
BREAK_AT = 3
#: The iterations of the resumed run.
MAX_ITERS = BREAK_AT + 1
#: The module name under which the fork server imports this file.
NAME = osp.splitext(osp.basename(__file__))[0]
#: Seconds a child may take to reach its break point.
CHILD_TIMEOUT = 240

#: trial name -> break point, max_keep_ckpts (``keep``, default -1) and
#: checkpoint interval (default 1)
TRIALS: Dict[str, Dict[str, Any]] = {
    'kill_in_save': dict(point='kill_in_save'),
    'kill_in_save_keep1': dict(point='kill_in_save', keep=1),
    'kill_writing_last_checkpoint': dict(point='kill_in_last_checkpoint'),
    'full_disk': dict(point='enospc_in_save'),
    'full_disk_keep1': dict(point='enospc_in_save', keep=1),
    'full_disk_last_checkpoint': dict(point='enospc_in_last_checkpoint'),
    'sigterm': dict(point='sigterm', interval=100),
    'truncated_newest': dict(point='truncate_newest'),
    'empty_last_checkpoint': dict(point='empty_last_checkpoint'),
}
GUARDS = ('off', 'skip')

CONFIG_TEMPLATE = """\
_base_ = {base!r}
train_dataloader = dict(
    dataset=dict(data_root={data_root!r}, indices=8),
    sampler=dict(type='DefaultSampler', shuffle=False),
)
train_cfg = dict(
    _delete_=True, type='IterBasedTrainLoop', max_iters={max_iters},
    val_interval=1000)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=10)
]
default_hooks = dict(
    checkpoint=dict(
        type='CheckpointHook', interval={interval}, by_epoch=False,
        max_keep_ckpts={keep}),
    logger=dict(type='LoggerHook', interval=1))
log_processor = dict(by_epoch=False)
custom_hooks = [dict(type='CrashTrialProbe')]
"""
#: Appended by ``flexible=True``: the same run under mmengine's
#: ``FlexibleRunner`` (``tools/train.py --guard skip`` builds
#: ``NanGuardFlexibleRunner``), whose strategy writes the checkpoints.
FLEXIBLE_RUNNER = """\
runner_type = 'FlexibleRunner'
strategy = dict(type='SingleDeviceStrategy')
"""
#: Appended by ``narrow=True``: ResNet-18 at a quarter of its width (a
#: 6 MB checkpoint instead of 96 MB), for the tests.
NARROW_MODEL = """\
model = dict(
    backbone=dict(base_channels=16),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=32),
    bbox_head=dict(in_channels=32, feat_channels=32),
)
"""


# -- the child: tools/train.py with a break point --------------------------
class _Break:
    """The break point of this child process (set by :func:`_child`)."""

    point = 'none'
    at = BREAK_AT
    marker = ''
    probe = ''
    iteration = 0  # the iteration whose checkpoint is being written
    target = ''  # the file write_durable is writing


def _signal_parent_and_wait() -> None:
    with open(_Break.marker, 'w') as f:
        f.write(str(os.getpid()))
    while True:  # the parent SIGKILLs us
        time.sleep(1)


def _breaks_here(name: str) -> bool:
    """Whether the write of ``name`` (a file name) is the one to break."""
    from mmnanguard.fileio.durable_file import TEMP_SUFFIX

    if _Break.iteration != _Break.at:
        return False
    if name == 'last_checkpoint':
        return _Break.point.endswith('_in_last_checkpoint')
    if name.startswith('.') and name.endswith(TEMP_SUFFIX):
        # the temporary file a FlexibleRunner's strategy fills by name
        name = name[1:].rsplit('.', 2)[0]
    return name == f'iter_{_Break.at}.pth' and _Break.point.endswith(
        '_in_save'
    )


def _break(data, write_half) -> None:
    """Write half of ``data`` (of ``last_checkpoint``: nothing, as between
    truncating and writing), then wait to be killed or raise ENOSPC."""
    last = _Break.point.endswith('_in_last_checkpoint')
    write_half(data[:0] if last else data[: len(data) // 2])
    if _Break.point.startswith('kill'):
        _signal_parent_and_wait()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _install_break_points() -> None:
    import builtins

    from mmengine.fileio.backends import local_backend
    from mmengine.hooks import Hook, checkpoint_hook
    from mmengine.registry import HOOKS

    from mmnanguard.engine.runner import (
        durable_checkpoint,
        durable_checkpoint_hook,
    )
    from mmnanguard.fileio import durable_file

    # bare mmengine: LocalBackend.put (open 'wb') and CheckpointHook's
    # open(last_checkpoint, 'w')
    original_put = local_backend.LocalBackend.put

    def put(self, obj, filepath):
        # a strategy's write through write_durable_by names the temporary
        # file by its descriptor (/proc/self/fd/N): the name it leads to
        if _breaks_here(osp.basename(osp.realpath(str(filepath)))):
            with open(filepath, 'wb') as f:

                def write_half(part):
                    f.write(part)
                    f.flush()

                _break(obj, write_half)
        return original_put(self, obj, filepath)

    local_backend.LocalBackend.put = put

    class _LastCheckpointFile:
        def __init__(self, path, mode, *args, **kwargs):
            self.file = builtins.open(path, mode, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            if _breaks_here('last_checkpoint'):

                def write_half(part):
                    self.file.write(part)
                    self.file.flush()

                _break(text, write_half)
            return self.file.write(text)

    def hook_open(path, mode='r', *args, **kwargs):
        if osp.basename(str(path)) == 'last_checkpoint' and 'w' in mode:
            return _LastCheckpointFile(path, mode, *args, **kwargs)
        return builtins.open(path, mode, *args, **kwargs)

    checkpoint_hook.open = hook_open

    # mmnanguard: write_durable -> write_all on the temporary file
    original_write_durable = durable_file.write_durable
    original_write_all = durable_file.write_all

    def write_durable(path, data):
        _Break.target = osp.basename(str(path))
        try:
            return original_write_durable(path, data)
        finally:
            _Break.target = ''

    def write_all(fd, data):
        if _breaks_here(_Break.target):
            _break(data, lambda part: original_write_all(fd, part))
        return original_write_all(fd, data)

    durable_file.write_all = write_all
    durable_checkpoint.write_durable = write_durable
    durable_checkpoint_hook.write_durable = write_durable

    @HOOKS.register_module(force=True)
    class CrashTrialProbe(Hook):
        """Logs the state a run starts from and each finished save."""

        priority = 'LOWEST'

        def before_train(self, runner) -> None:
            model = getattr(runner.model, 'module', runner.model)
            digests = tensor_digests(model.state_dict())
            _append(dict(event='start', iter=runner.iter, digests=digests))

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            _Break.iteration = runner.iter + 1
            if _Break.point == 'sigterm' and _Break.iteration == _Break.at:
                os.kill(os.getpid(), signal.SIGTERM)

        def after_train_iter(
            self, runner, batch_idx, data_batch=None, outputs=None
        ):
            saved = runner.message_hub.get_info('last_ckpt')
            if saved and osp.basename(saved) == f'iter_{runner.iter + 1}.pth':
                _append(dict(event='saved', iter=runner.iter + 1, path=saved))


def _append(record: Dict[str, Any]) -> None:
    if not _Break.probe:
        return
    with open(_Break.probe, 'a') as f:
        f.write(json.dumps(record) + '\n')
        f.flush()
        os.fsync(f.fileno())


def _child(argv: List[str], settings: Dict[str, Any], log: str) -> None:
    """The child process: ``tools/train.py ARGV`` with a break point.

    Started from a fork server that has imported the stack once (see
    :func:`_context`); its output goes to ``log``, its exit status is the
    one of ``tools/train.py``.
    """
    import torch

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(REPO)
    os.environ['PYTHONWARNINGS'] = 'ignore'
    torch.set_num_threads(1)
    for key, value in settings.items():
        setattr(_Break, key, value)
    sys.path.insert(0, osp.dirname(TRAIN))
    import train  # tools/train.py

    _install_break_points()
    code = train.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


_CONTEXT: List[Any] = []


def _context():
    """A fork server that imports torch and the OpenMMLab stack once; each
    child is a fork of it (about 10 s of imports saved per child)."""
    if not _CONTEXT:
        ctx = multiprocessing.get_context('forkserver')
        ctx.set_forkserver_preload(
            ['torch', 'mmnanguard', 'mmdet.models', 'mmrotate.models', NAME]
        )
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


# -- the parent ------------------------------------------------------------
@dataclass
class TrialResult:
    """What one trial found (see the module docstring)."""

    trial: str
    guard: str
    first_exit: Optional[int] = None
    killed: bool = False
    completed: List[str] = field(default_factory=list)
    lost: List[str] = field(default_factory=list)
    last_checkpoint: str = ''
    leftovers: List[str] = field(default_factory=list)
    partial: List[str] = field(default_factory=list)
    leftovers_after_resume: List[str] = field(default_factory=list)
    resume_exit: Optional[int] = None
    resume_error: str = ''
    resumed_at: Optional[int] = None
    expected_at: int = 0
    weights_match: Optional[bool] = None
    seconds: float = 0.0

    @property
    def survived(self) -> bool:
        """Resumed from the newest complete state, nothing lost."""
        return (
            self.resume_exit == 0
            and not self.lost
            and (self.resumed_at or 0) >= self.expected_at
            and (self.weights_match or self.resumed_at == 0)
        )

    def outcome(self) -> str:
        """One cell of the side-by-side table."""
        if self.resume_exit != 0:
            return f'resume fails: {self.resume_error}'
        text = f'resumes at iter {self.resumed_at}'
        if (self.resumed_at or 0) < self.expected_at:
            lost = self.expected_at - (self.resumed_at or 0)
            text += f' ({lost} iteration(s) lost)'
        if self.weights_match is False:
            text += ', weights differ from its checkpoint'
        if self.lost:
            text += f'; lost {", ".join(self.lost)}'
        return text


def _run_child(
    args: List[str], settings: Dict[str, Any], log: str
) -> Dict[str, Any]:
    """Run one child; SIGKILL it once it has written its marker."""
    marker = settings.get('marker', '')
    child = _context().Process(target=_child, args=(args, settings, log))
    child.start()
    deadline = time.time() + CHILD_TIMEOUT
    while child.is_alive():
        if marker and osp.exists(marker):
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            return dict(code=child.exitcode, killed=True)
        if time.time() > deadline:
            child.kill()
            child.join()
            raise TimeoutError(f'tools/train.py {args} hung; see {log}')
        time.sleep(0.05)
    child.join()
    return dict(code=child.exitcode, killed=False)


def _listing(work_dir: str) -> List[str]:
    return sorted(os.listdir(work_dir)) if osp.isdir(work_dir) else []


def _hidden(work_dir: str) -> List[str]:
    return [n for n in _listing(work_dir) if n.startswith('.')]


def _number(path: str) -> int:
    return int(osp.basename(path)[len('iter_') : -len('.pth')])


def _numbered(work_dir: str) -> List[str]:
    return [
        osp.join(work_dir, n)
        for n in _listing(work_dir)
        if n.startswith('iter_') and n.endswith('.pth')
    ]


def _starts(probe: str) -> List[Dict[str, Any]]:
    return [r for r in _read_probe(probe) if r['event'] == 'start']


def _read_probe(path: str) -> List[Dict[str, Any]]:
    if not osp.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _last_error(log: str) -> str:
    with open(log, errors='replace') as f:
        lines = [line.strip() for line in f if line.strip()]
    for line in reversed(lines):
        if 'Error' in line or 'error' in line:
            return _first_sentence(line)
    return _first_sentence(lines[-1]) if lines else ''


def _first_sentence(line: str) -> str:
    """``Type: message`` up to the end of its first sentence."""
    head, _, rest = line.partition(': ')
    end = rest.find('. ')
    return f'{head}: {rest[: end + 1] if end >= 0 else rest}'[:160]


def tensor_digests(state: Dict[str, Any]) -> Dict[str, str]:
    """SHA-1 of the bytes of every floating tensor of a state dict."""
    import torch

    return {
        k: hashlib.sha1(
            v.detach().cpu().contiguous().numpy().tobytes()
        ).hexdigest()
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def _checkpoint_digests(path: str) -> Dict[str, str]:
    from mmnanguard.compat.checkpoint_allowlist import load_from_local

    return tensor_digests(
        load_from_local(path, map_location='cpu')['state_dict']
    )


def _loads(path: str) -> bool:
    from mmnanguard.fileio.checkpoint_verify import checkpoint_problem

    return checkpoint_problem(path, load=True) is None


def _last_checkpoint_state(work_dir: str) -> str:
    path = osp.join(work_dir, 'last_checkpoint')
    if not osp.exists(path):
        return 'absent'
    with open(path) as f:
        named = f.read().strip()
    if not named:
        return 'empty'
    if not osp.exists(named):
        return f'names missing {osp.basename(named)}'
    if not _loads(named):
        return f'names broken {osp.basename(named)}'
    return f'complete ({osp.basename(named)})'


def write_config(
    folder: str,
    data_root: str,
    trial: str,
    narrow: bool = False,
    flexible: bool = False,
) -> str:
    """Write the trial's config (the tiny DOTA config, iteration-based;
    ``narrow``: with :data:`NARROW_MODEL`; ``flexible``: with
    :data:`FLEXIBLE_RUNNER`)."""
    spec = TRIALS[trial]
    path = osp.join(folder, f'{trial}.py')
    with open(path, 'w') as f:
        f.write(
            CONFIG_TEMPLATE.format(
                base=TINY_DOTA,
                data_root=osp.join(data_root, ''),
                max_iters=MAX_ITERS,
                interval=spec.get('interval', 1),
                keep=spec.get('keep', -1),
            )
        )
        if narrow:
            f.write(NARROW_MODEL)
        if flexible:
            f.write(FLEXIBLE_RUNNER)
    return path


def run_trial(
    trial: str,
    guard: str,
    folder: str,
    data_root: str,
    narrow: bool = False,
    flexible: bool = False,
) -> TrialResult:
    """Run one trial in ``folder``; return its :class:`TrialResult`.

    Args:
        trial (str): A key of :data:`TRIALS`.
        guard (str): ``'off'`` (bare mmengine) or ``'skip'`` (protected).
        folder (str): A new folder for the config, the work dir and logs.
        data_root (str): A generated DOTA folder (8 images or more).
        narrow (bool): Use :data:`NARROW_MODEL` (faster; for the tests).
        flexible (bool): Train under ``FlexibleRunner``
            (:data:`FLEXIBLE_RUNNER`).
    """
    start = time.time()
    os.makedirs(folder, exist_ok=True)
    spec = TRIALS[trial]
    point = spec['point']
    config = write_config(folder, data_root, trial, narrow, flexible)
    work_dir = osp.join(folder, 'work')
    probe = osp.join(folder, 'probe.jsonl')
    marker = osp.join(folder, 'marker')
    log = osp.join(folder, 'log.txt')
    base = [config, '--work-dir', work_dir, '--guard', guard]
    settings = dict(
        probe=probe,
        marker=marker if point.startswith('kill') else '',
        point=point,
        at=BREAK_AT,
    )
    if point in ('truncate_newest', 'empty_last_checkpoint'):
        settings['point'] = 'none'
    result = TrialResult(trial, guard)
    first = base + ['--cfg-options', f'train_cfg.max_iters={BREAK_AT}']
    ran = _run_child(first, settings, log)
    result.first_exit, result.killed = ran['code'], ran['killed']
    records = _read_probe(probe)
    completed = [r['path'] for r in records if r['event'] == 'saved']
    newest = completed[-1] if completed else None
    if point == 'truncate_newest' and newest:
        size = osp.getsize(newest)
        with open(newest, 'r+b') as f:
            f.truncate(size // 2)
        completed = completed[:-1]
        newest = completed[-1] if completed else None
    if point == 'empty_last_checkpoint':
        open(osp.join(work_dir, 'last_checkpoint'), 'w').close()
    keep = spec.get('keep', -1)
    must_exist = completed[-keep:] if keep > 0 else completed
    result.completed = [osp.basename(p) for p in completed]
    result.lost = [
        osp.basename(p)
        for p in must_exist
        if not (osp.exists(p) and _loads(p))
    ]
    result.last_checkpoint = _last_checkpoint_state(work_dir)
    result.leftovers = _hidden(work_dir)
    result.expected_at = _number(newest) if newest else 0
    if point == 'sigterm':  # nothing lost: the state after that iteration
        result.expected_at = BREAK_AT
    loading = [p for p in _numbered(work_dir) if _loads(p)]
    # checkpoint names on disk that do not load: a part under a final name
    result.partial = [
        osp.basename(p) for p in _numbered(work_dir) if p not in loading
    ]
    digests = {_number(p): _checkpoint_digests(p) for p in loading}
    # the resume, as a scheduler's requeue runs it
    settings.update(point='none', marker='')
    starts_before = len(_starts(probe))
    resumed = _run_child(base + ['--resume'], settings, log)
    result.resume_exit = resumed['code']
    if result.resume_exit != 0:
        # no machine paths in the table: relative to the trial folder
        result.resume_error = _last_error(log).replace(folder + os.sep, '')
    result.leftovers_after_resume = _hidden(work_dir)
    starts = _starts(probe)
    if len(starts) > starts_before:
        start_record = starts[-1]
        result.resumed_at = start_record['iter']
        if result.resumed_at in digests:
            expected = digests[result.resumed_at]
            result.weights_match = expected == start_record['digests']
        elif result.resumed_at > 0:
            result.weights_match = False
    result.seconds = round(time.time() - start, 1)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """Run one trial: ``TRIAL GUARD FOLDER DATA_ROOT``; print its result."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('trial', choices=sorted(TRIALS))
    parser.add_argument('guard', choices=GUARDS)
    parser.add_argument('folder')
    parser.add_argument('data_root')
    parser.add_argument(
        '--flexible', action='store_true', help='under FlexibleRunner'
    )
    args = parser.parse_args(argv)
    result = run_trial(
        args.trial,
        args.guard,
        args.folder,
        args.data_root,
        flexible=args.flexible,
    )
    print(json.dumps(dict(asdict(result), outcome=result.outcome())))
    return 0


if __name__ == '__main__':
    sys.exit(main())
