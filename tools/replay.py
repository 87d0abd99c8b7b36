# Copyright (c) mmnanguard contributors. All rights reserved.
"""Re-run the diagnosis of a NanGuard incident offline and print it.

Usage::

    python tools/replay.py INCIDENT_DIR [--checkpoint CKPT] [--config CFG]
                           [--fp32] [--anomaly] [--write]

``INCIDENT_DIR`` is a folder ``{work_dir}/nanguard/incident_*`` written by
``NanGuardHook`` (``report.json``, ``batch.pth``) and ``NanDiagnosisHook``
(``config.py``, the run's config, and ``model.pth``, the weights the
in-training replay started from). The model is built from ``config.py``
(or ``--config``) and loaded from ``model.pth`` (or ``--checkpoint``, an
mmengine checkpoint); the batch is replayed with its saved RNG states under
forward and gradient hooks on every module, and the verdict, the evidence
and the remedy are printed as Markdown.

``batch.pth`` holds mmengine data samples, which only
``torch.load(..., weights_only=False)`` can read, and a full unpickler can
run code from a crafted file. It is loaded only after checking that it is
an incident file: the folder name, a matching incident ``report.json``, and
every global the pickle references inside the OpenMMLab/torch/numpy
packages (see :func:`mmnanguard.engine.diagnosis.load_incident`). Replay
folders you trust.

Options:
    --fp32: replay in fp32 only (default: the run's AMP dtype, when it used
        AMP, then fp32 as well).
    --anomaly: run under ``torch.autograd.detect_anomaly`` and print the
        failing backward op with its forward traceback.
    --write: rewrite ``report.json``, ``report.md`` and ``timeline.png`` of
        the folder with this diagnosis.
"""

import argparse
import os.path as osp
import sys

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import load_checkpoint

import mmnanguard  # noqa: F401  (stack mends before mmrotate)
from mmnanguard.engine.diagnosis import (
    diagnose,
    load_incident,
    render_markdown,
    write_diagnosis,
)
from mmnanguard.engine.hooks.nan_diagnosis_hook import CONFIG_NAME, MODEL_NAME


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
        '--config', help='config (default: ' 'INCIDENT_DIR/config.py)'
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


def build_model(cfg: Config, folder: str, checkpoint: str = None):
    """The config's model with the incident's (or the given) weights."""
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    model = MODELS.build(cfg.model)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu')
        return model, f'the checkpoint {checkpoint}'
    path = osp.join(folder, MODEL_NAME)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{path} does not exist (NanDiagnosisHook(save_model=True) '
            'writes it): pass --checkpoint CKPT'
        )
    model.load_state_dict(
        torch.load(path, map_location='cpu', weights_only=True)
    )
    return model, f'{path} (the state the in-training replay started from)'


def main(argv=None) -> int:
    args = parse_args(argv)
    folder = osp.abspath(args.incident_dir)
    report, batch = load_incident(folder)
    config = args.config or osp.join(folder, CONFIG_NAME)
    if not osp.isfile(config):
        raise FileNotFoundError(
            f'{config} does not exist (NanDiagnosisHook writes it): pass '
            '--config CFG, the config of the run'
        )
    cfg = Config.fromfile(config)
    model, state = build_model(cfg, folder, args.checkpoint)
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
