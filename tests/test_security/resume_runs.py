# Copyright (c) mmnanguard contributors. All rights reserved.
"""A real run of the tiny RetinaNet COCO config through ``tools/train.py``,
and resumes of crafted copies of its checkpoints, for the tests of what a
checkpoint may make a run do (``test_resume_values.py``).

The run trains 3 iterations with the ``mmnanguard`` include and a
checkpoint every iteration (``iter_1.pth`` .. ``iter_3.pth``). A resume
copies the checkpoints it needs into a fresh work dir (the test crafts
them there), and runs ``tools/train.py --resume`` in this process with
``max_iters`` at the resumed iteration: the runner is built, the
checkpoint resumed and ``before_train`` run (where ``CheckpointHook``
acts on the resumed ``keep_ckpt_ids``), no iteration is trained.
"""

import glob
import importlib.util
import os.path as osp
import shutil
import uuid
from typing import Any, Callable, Dict, List, Optional

import torch

from mmnanguard.testing import TINY_COCO_CONFIG, load_tiny_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MAX_ITERS = 3


def load_tool(name: str):
    """``tools/<name>.py`` as a module (its ``main(argv)`` returns the exit
    status)."""
    path = osp.join(REPO, 'tools', f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'{name}_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_config(folder: str, data_root: str) -> str:
    """The tiny config with the include, iteration-based, a checkpoint
    every iteration, written as one file for ``tools/train.py``."""
    with_include = osp.join(folder, 'with_include.py')
    with open(with_include, 'w') as f:
        f.write(
            f'_base_ = [{TINY_COCO_CONFIG!r}, '
            "'mmnanguard::_base_/nanguard.py']\n"
        )
    cfg = load_tiny_config(
        with_include, osp.join(folder, 'unused'), data_root, MAX_ITERS
    )
    cfg.default_hooks.checkpoint.interval = 1
    cfg.default_hooks.checkpoint.max_keep_ckpts = 3
    cfg.pop('experiment_name')
    path = osp.join(folder, 'retinanet_tiny_resume.py')
    cfg.dump(path)
    return path


def train(tool, config: str, work_dir: str, *extra: str) -> int:
    """``tools/train.py CONFIG --work-dir WORK_DIR EXTRA...``; a unique
    experiment name (mmengine reuses a logger of the same name)."""
    return tool.main(
        [config, '--work-dir', work_dir]
        + list(extra)
        + ['--cfg-options', f'experiment_name=r{uuid.uuid4().hex[:10]}']
    )


def trained_run(folder: str, data_root: str) -> Dict[str, Any]:
    """Train the config 3 iterations; return ``tool``, ``config`` and
    ``work_dir``."""
    tool = load_tool('train')
    config = write_config(folder, data_root)
    work_dir = osp.join(folder, 'work')
    assert train(tool, config, work_dir) == 0
    for step in range(1, MAX_ITERS + 1):
        assert osp.isfile(osp.join(work_dir, f'iter_{step}.pth'))
    return dict(tool=tool, config=config, work_dir=work_dir)


def load(path: str) -> Dict[str, Any]:
    """A checkpoint this test session wrote (``weights_only=False`` is
    fine for it)."""
    return torch.load(path, map_location='cpu', weights_only=False)


def crafted_copy(
    run: Dict[str, Any],
    work_dir: str,
    craft: Optional[Callable[[Dict[str, Any]], None]] = None,
    steps: List[int] = (1, 2, 3),
) -> str:
    """Copy ``iter_<step>.pth`` of ``run`` into ``work_dir``, the newest
    changed by ``craft(checkpoint)``, and name it in ``last_checkpoint``.

    Returns:
        str: The newest checkpoint's path.
    """
    newest = None
    for step in steps:
        src = osp.join(run['work_dir'], f'iter_{step}.pth')
        newest = osp.join(work_dir, f'iter_{step}.pth')
        shutil.copyfile(src, newest)
    if craft is not None:
        checkpoint = load(newest)
        craft(checkpoint)
        torch.save(checkpoint, newest)
    with open(osp.join(work_dir, 'last_checkpoint'), 'w') as f:
        f.write(newest)
    return newest


def run_log(work_dir: str) -> str:
    """The text of every log file of ``work_dir`` (mmengine writes one per
    run, ``<timestamp>/<timestamp>.log``)."""
    text = ''
    for path in sorted(glob.glob(osp.join(work_dir, '*', '*.log'))):
        with open(path, encoding='utf-8') as f:
            text += f.read()
    return text
