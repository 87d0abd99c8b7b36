# Copyright (c) mmnanguard contributors. All rights reserved.
"""A toy mmengine model and dataset for unit tests of the guard.

The honest scope of these is the optimizer-wrapper and hook machinery;
the real mmdet/mmrotate configs are exercised elsewhere.
"""

import uuid
from typing import Any, Dict, Optional

import torch
from mmengine.model import BaseModel
from torch import nn
from torch.utils.data import Dataset


class ToyDataset(Dataset):
    """``n`` samples of ``inputs`` (4 floats) and ``labels`` (1 float)."""

    def __init__(self, n: int = 32, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(n, 4, generator=gen)
        self.labels = self.inputs.sum(1, keepdim=True) * 0.5
        self.metainfo = dict(classes=('toy',))

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, idx: int) -> Dict[str, Any]:
        return dict(inputs=self.inputs[idx], labels=self.labels[idx])


class ToyModel(BaseModel):
    """Two linear heads ``a`` and ``b``; two loss terms.

    Args:
        dtype (torch.dtype): Parameter dtype. Defaults to float32.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.a = nn.Linear(4, 1).to(dtype)
        self.b = nn.Linear(4, 1).to(dtype)
        self.loss_scale_factor: Optional[float] = None

    def forward(self, inputs, labels=None, mode: str = 'tensor'):
        x = inputs.to(self.a.weight.dtype)
        pred_a, pred_b = self.a(x), self.b(x)
        if mode != 'loss':
            return pred_a
        labels = labels.to(pred_a.dtype)
        return dict(
            loss_a=((pred_a - labels) ** 2).mean(),
            loss_b=((pred_b - labels) ** 2).mean(),
        )


class TwoOptimizerToyModel(ToyModel):
    """:class:`ToyModel` trained by an ``OptimWrapperDict`` (``a``, ``b``)."""

    def train_step(self, data, optim_wrapper):
        data = self.data_preprocessor(data, True)
        losses = self._run_forward(data, mode='loss')
        for key in ('a', 'b'):
            loss, _ = self.parse_losses({f'loss_{key}': losses[f'loss_{key}']})
            optim_wrapper[key].update_params(loss)
        _, log_vars = self.parse_losses(losses)
        return log_vars


def toy_runner_cfg(
    work_dir: str,
    max_iters: int = 6,
    custom_hooks: Optional[list] = None,
    optim_wrapper: Optional[dict] = None,
    model: Optional[nn.Module] = None,
    **kwargs: Any,
) -> Dict[str, Any]:
    """Keyword arguments of ``Runner(...)`` for a toy iteration-based run."""
    cfg = dict(
        model=model if model is not None else ToyModel(),
        work_dir=work_dir,
        train_dataloader=dict(
            dataset=ToyDataset(),
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate'),
            batch_size=2,
            num_workers=0,
        ),
        optim_wrapper=optim_wrapper
        or dict(
            type='OptimWrapper',
            optimizer=dict(type='SGD', lr=0.01, momentum=0.9),
        ),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=1),
            checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
        ),
        custom_hooks=custom_hooks or [],
        log_processor=dict(by_epoch=False, window_size=1),
        randomness=dict(seed=0),
        default_scope='mmengine',
        # unique: mmengine reuses a Visualizer/logger of the same name
        experiment_name=f'toy_{uuid.uuid4().hex[:12]}',
    )
    cfg.update(kwargs)
    return cfg


#: The names :func:`register_toy` gives in mmengine's root registries.
TOY_MODEL = 'NanGuardToyModel'
TOY_DATASET = 'NanGuardToyDataset'


def register_toy() -> None:
    """Register :class:`ToyModel` and :class:`ToyDataset` in mmengine's
    root ``MODELS`` and ``DATASETS`` as :data:`TOY_MODEL` and
    :data:`TOY_DATASET` (once), for configs run in subprocesses."""
    from mmengine.registry import DATASETS, MODELS

    if MODELS.get(TOY_MODEL) is None:
        MODELS.register_module(TOY_MODEL, module=ToyModel)
    if DATASETS.get(TOY_DATASET) is None:
        DATASETS.register_module(TOY_DATASET, module=ToyDataset)
