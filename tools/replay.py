# Copyright (c) mmnanguard contributors. All rights reserved.
"""Re-run the diagnosis of a NanGuard incident offline and print it.

Usage::

    python tools/replay.py INCIDENT_DIR --config CFG [--checkpoint CKPT]
                           [--fp32] [--anomaly] [--write]
    python tools/replay.py INCIDENT_DIR --trust-config [...]

``INCIDENT_DIR`` is a folder ``{work_dir}/nanguard/incident_*`` written by
``NanGuardHook`` (``report.json``, ``batch.pth``) and ``NanDiagnosisHook``
(``config.py``, the run's config, and ``model.pth``, the weights the
in-training replay started from). The model is built from the config you
name with ``--config`` and loaded from ``model.pth`` (or ``--checkpoint``,
an mmengine checkpoint); the batch is replayed with its saved RNG states
under forward and gradient hooks on every module, and the verdict, the
evidence and the remedy are printed as Markdown.

An incident folder is data, never code. ``report.json`` is JSON;
``batch.pth`` and ``model.pth`` are loaded with ``weights_only=True`` and
an exact allowlist (tensors, numpy arrays, the OpenMMLab data classes; see
:func:`mmnanguard.engine.incident.load_batch`), and a file that
holds anything else is refused, naming it. A folder that is a link or
holds a link is refused, and ``--write`` writes nothing through a link
(:func:`mmnanguard.engine.incident.write_incident_file`). The
folder's ``config.py`` is Python: loading it runs it. It is used only
with ``--trust-config``, for folders you wrote yourself; ``--config``
naming a file inside the folder counts as the folder's config.

Options:
    --config CFG: the run's config, from your own checkout.
    --trust-config: build the model from INCIDENT_DIR/config.py instead
        (runs that file).
    --fp32: replay in fp32 only (default: the run's AMP dtype, when it used
        AMP, then fp32 as well).
    --anomaly: run under ``torch.autograd.detect_anomaly`` and print the
        failing backward op with its forward traceback.
    --write: rewrite ``report.json``, ``report.md`` and ``timeline.png`` of
        the folder with this diagnosis.

Exit status: 0 when replayed, 2 when an input is refused, missing or
does not replay (one paragraph on stderr names the file and says why).
"""

import argparse
import os.path as osp
import pickle
import sys
from typing import Any, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import load_checkpoint

import mmnanguard  # noqa: F401  (stack mends before mmrotate)
from mmnanguard.analysis.cli import load_config as load_config_file
from mmnanguard.engine.diagnosis import (
    diagnose,
    render_markdown,
    write_diagnosis,
)
from mmnanguard.engine.incident import (
    CONFIG_NAME,
    MODEL_NAME,
    REPORT_NAME,
    load_incident,
    load_model_state,
)

#: Errors of reading the inputs: reported in one paragraph, exit status 2.
INPUT_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    SyntaxError,
    RuntimeError,
    pickle.UnpicklingError,
)
#: Errors of a replay of a batch and report that do not fit the model.
REPLAY_ERRORS = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
    RuntimeError,
    RecursionError,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Replay a NanGuard incident and name its cause.'
    )
    parser.add_argument('incident_dir', help='nanguard/incident_* folder')
    parser.add_argument(
        '--checkpoint',
        help='mmengine checkpoint to replay '
        'from (default: INCIDENT_DIR/model.pth)',
    )
    parser.add_argument(
        '--config',
        help='the config of the run, from your own checkout: the model '
        'is built from it',
    )
    parser.add_argument(
        '--trust-config',
        action='store_true',
        help='build the model from INCIDENT_DIR/config.py instead. That '
        'file is Python and loading it runs it: use this only for folders '
        'you wrote yourself; a folder from elsewhere is data, never code',
    )
    parser.add_argument(
        '--fp32', action='store_true', help='replay in fp32 only'
    )
    parser.add_argument(
        '--anomaly',
        action='store_true',
        help='torch.autograd.detect_anomaly backtrace',
    )
    parser.add_argument(
        '--write',
        action='store_true',
        help='rewrite the report files of INCIDENT_DIR',
    )
    return parser.parse_args(argv)


def amp_dtype_of(cfg: Config):
    """The autocast dtype of the config's optim wrapper, or None."""
    wrapper = cfg.get('optim_wrapper', {}) or {}
    if 'Amp' not in str(wrapper.get('type', '')):
        return None
    dtype = wrapper.get('dtype') or 'float16'
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` (links resolved) lies in ``folder``."""
    real, root = osp.realpath(path), osp.realpath(folder)
    return osp.commonpath([real, root]) == root


def config_path(args: argparse.Namespace, folder: str) -> str:
    """The config to build the model from: ``--config``, or the folder's
    ``config.py`` under ``--trust-config``.

    A ``--config`` inside the incident folder is the folder's own config:
    it needs ``--trust-config`` like ``config.py`` does.

    Raises:
        ValueError: Neither was given, or both, or ``--config`` names a
            file of the folder without ``--trust-config``.
        FileNotFoundError: The config does not exist.
    """
    own = bool(args.config) and inside(args.config, folder)
    if own and not args.trust_config:
        raise ValueError(
            f'--config {args.config} is inside the incident folder '
            f'{folder}: it came with the folder, is Python and runs when '
            "loaded. Pass --config CFG (the run's config, from your own "
            'checkout) or, for a folder you wrote yourself, --trust-config'
        )
    if args.config and args.trust_config and not own:
        raise ValueError(
            'pass either --config CFG or --trust-config, not both'
        )
    if not args.config and not args.trust_config:
        raise ValueError(
            f'{folder} carries {CONFIG_NAME}, which is Python and runs '
            'when loaded; it is not used unless you say so. Pass --config '
            "CFG (the run's config, from your own checkout) or, for a "
            'folder you wrote yourself, --trust-config'
        )
    config = args.config or osp.join(folder, CONFIG_NAME)
    if not osp.isfile(config):
        raise FileNotFoundError(
            f'{config} does not exist (NanDiagnosisHook writes '
            f'{CONFIG_NAME}): pass --config CFG, the config of the run'
        )
    return config


def load_config(path: str) -> Config:
    """``Config.fromfile(path)``; every error names the file.

    Raises:
        ValueError: The file is not a config, or loading it failed.
    """
    cfg, error = load_config_file(path)
    if error is not None:
        raise ValueError(error)
    return cfg


def build_model(cfg: Config, folder: str, checkpoint: Optional[str] = None):
    """The config's model with the incident's (or the given) weights."""
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    try:
        model = MODELS.build(cfg.model)
    except (*REPLAY_ERRORS, ImportError) as err:
        raise ValueError(
            f'cannot build the model of the config {cfg.filename}: '
            f'{type(err).__name__}: {err}'
        ) from err
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu')
        return model, f'the checkpoint {checkpoint}'
    path = osp.join(folder, MODEL_NAME)
    try:
        model.load_state_dict(load_model_state(path))
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f'{path} does not fit the model of the config {cfg.filename}: '
            f'{type(err).__name__}: {err}'
        ) from err
    return model, f'{path} (the state the in-training replay started from)'


def load_inputs(args: argparse.Namespace) -> Tuple[Any, ...]:
    """Report, batch, config and model of the replay, each checked."""
    folder = osp.abspath(args.incident_dir)
    report, batch = load_incident(folder)
    cfg = load_config(config_path(args, folder))
    model, state = build_model(cfg, folder, args.checkpoint)
    return folder, report, batch, cfg, model, state


def error(message: Any) -> int:
    """Print ``message`` as one paragraph on stderr; return 2."""
    text = ' '.join(str(message).split())
    if text.startswith('nanguard: '):
        text = text[len('nanguard: ') :]
    print(f'replay: error: {text}', file=sys.stderr, flush=True)
    return 2


def replay(args: argparse.Namespace, inputs: Tuple[Any, ...]) -> str:
    """Diagnose the incident; return the Markdown of the verdict."""
    folder, report, batch, cfg, model, state = inputs
    amp_dtype = None if args.fp32 else amp_dtype_of(cfg)
    loss_scale = report.get('loss_scale') if amp_dtype is not None else None
    try:
        diagnose(
            model,
            report,
            batch,
            replay_state=f'offline: {state}',
            amp_dtype=amp_dtype,
            loss_scale=loss_scale,
            anomaly=args.anomaly,
        ).apply_to(report)
        return render_markdown(report)
    except REPLAY_ERRORS as err:
        raise ValueError(
            f'replaying the incident {folder} ({osp.join(folder, REPORT_NAME)}'
            f' and its batch) with the model of {cfg.filename} failed: '
            f'{type(err).__name__}: {err}'
        ) from err


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        inputs = load_inputs(args)
        text = replay(args, inputs)
        if args.write:
            write_diagnosis(inputs[1], inputs[0])
    except INPUT_ERRORS as err:
        return error(err)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
