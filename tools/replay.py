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
:func:`mmnanguard.engine.diagnosis.incident_files.load_batch`), and a file
that holds anything else is refused, naming it. The folder's ``config.py``
is Python: loading it runs it. It is used only with ``--trust-config``,
for folders you wrote yourself.

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

Exit status: 0 when replayed, 2 when an input is refused or missing (one
line on stderr says which and why).
"""

import argparse
import os.path as osp
import pickle
import sys
from typing import Any, Dict, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import load_checkpoint

import mmnanguard  # noqa: F401  (stack mends before mmrotate)
from mmnanguard.compat.safe_load import weights_only_load
from mmnanguard.engine.diagnosis import (
    diagnose,
    load_incident,
    render_markdown,
    write_diagnosis,
)
from mmnanguard.engine.hooks.nan_diagnosis_hook import CONFIG_NAME, MODEL_NAME

#: Errors of reading the inputs: reported in one line, exit status 2.
INPUT_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    SyntaxError,
    RuntimeError,
    pickle.UnpicklingError,
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


def config_path(args: argparse.Namespace, folder: str) -> str:
    """The config to build the model from: ``--config``, or the folder's
    ``config.py`` under ``--trust-config``.

    Raises:
        ValueError: Neither was given, or both.
        FileNotFoundError: The config does not exist.
    """
    if args.config and args.trust_config:
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


def load_model_state(path: str) -> Dict[str, torch.Tensor]:
    """``model.pth``: a plain state dict, loaded as data only.

    Raises:
        FileNotFoundError: There is no such file.
        UntrustedFileError: It holds anything beyond tensors in dicts.
        ValueError: It is not a dict of tensors.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{path} does not exist (NanDiagnosisHook(save_model=True) '
            'writes it): pass --checkpoint CKPT'
        )
    state = weights_only_load(path, [], what='model state')
    if not isinstance(state, dict) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        raise ValueError(
            f'{path} is not a model state dict: expected a dict of '
            'tensors (what NanDiagnosisHook writes)'
        )
    return state


def build_model(cfg: Config, folder: str, checkpoint: Optional[str] = None):
    """The config's model with the incident's (or the given) weights."""
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    model = MODELS.build(cfg.model)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu')
        return model, f'the checkpoint {checkpoint}'
    path = osp.join(folder, MODEL_NAME)
    model.load_state_dict(load_model_state(path))
    return model, f'{path} (the state the in-training replay started from)'


def load_inputs(args: argparse.Namespace) -> Tuple[Any, ...]:
    """Report, batch, config and model of the replay, each checked."""
    folder = osp.abspath(args.incident_dir)
    report, batch = load_incident(folder)
    cfg = Config.fromfile(config_path(args, folder))
    model, state = build_model(cfg, folder, args.checkpoint)
    return folder, report, batch, cfg, model, state


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        folder, report, batch, cfg, model, state = load_inputs(args)
    except INPUT_ERRORS as err:
        print(f'replay: error: {err}', file=sys.stderr)
        return 2
    amp_dtype = None if args.fp32 else amp_dtype_of(cfg)
    loss_scale = report.get('loss_scale') if amp_dtype is not None else None
    diagnose(
        model,
        report,
        batch,
        replay_state=f'offline: {state}',
        amp_dtype=amp_dtype,
        loss_scale=loss_scale,
        anomaly=args.anomaly,
    )
    if args.write:
        write_diagnosis(report, folder)
    print(render_markdown(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
