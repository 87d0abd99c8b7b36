# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the doctor's rules read off a config: values as written, classes
that the types resolve to in the config's scope, the built losses, and,
for the rules that need it, the built model (no weights loaded, no
dataset built)."""

import inspect
from functools import cached_property
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import OPTIM_WRAPPERS, OPTIMIZERS

from mmnanguard.config_walk import (
    LossEntry,
    build_in_scope,
    find_loss_configs,
    resolve_type,
)


def default_of(cls: Any, name: str, fallback: Any = None) -> Any:
    """The default of argument ``name`` of ``cls.__init__``."""
    try:
        param = inspect.signature(cls).parameters.get(name)
    except (TypeError, ValueError):
        return fallback
    if param is None or param.default is inspect.Parameter.empty:
        return fallback
    return param.default


class DoctorContext:
    """A loaded config and what the rules need from it.

    Args:
        cfg (Config): The loaded config.
        num_gpus (int): Number of processes training will run on.
            Defaults to 1.
        label_samples (int): How many segmentation label maps to read.
            Defaults to 4.

    Raises:
        ValueError: ``num_gpus`` is not an integer >= 1.
    """

    def __init__(
        self, cfg: Config, num_gpus: int = 1, label_samples: int = 4
    ) -> None:
        if not isinstance(num_gpus, int) or num_gpus < 1:
            raise ValueError(
                f'num_gpus must be an integer >= 1, got {num_gpus!r}'
            )
        self.cfg = cfg
        self.num_gpus = num_gpus
        self.label_samples = label_samples
        self.scope: Optional[str] = cfg.get('default_scope')

    def resolve(self, type_name: Any, registry=None) -> Optional[type]:
        """The class ``type_name`` names in the config's scope."""
        if registry is None:
            return resolve_type(type_name, self.scope)
        return resolve_type(type_name, self.scope, registry)

    @property
    def optim_wrapper(self) -> Dict[str, Any]:
        """``optim_wrapper`` as written (empty if absent)."""
        return dict(self.cfg.get('optim_wrapper') or {})

    @property
    def optimizer(self) -> Dict[str, Any]:
        """``optim_wrapper.optimizer`` as written (empty if absent)."""
        return dict(self.optim_wrapper.get('optimizer') or {})

    @cached_property
    def optimizer_class(self) -> Optional[type]:
        """The optimizer's class."""
        return self.resolve(self.optimizer.get('type'), OPTIMIZERS)

    @cached_property
    def built_optimizer(self) -> Optional[torch.optim.Optimizer]:
        """The optimizer as training builds it (its class from the
        config's scope, its arguments), on one stand-in parameter; None
        without an optimizer or when it does not build (the error is then
        in :attr:`optimizer_error`)."""
        self.optimizer_error: Optional[str] = None
        if not self.optimizer.get('type'):
            return None
        stand_in = nn.Parameter(torch.zeros(1))
        try:
            return build_in_scope(
                dict(self.optimizer, params=[stand_in]),
                self.scope,
                OPTIMIZERS,
            )
        except (KeyError, TypeError, ValueError, ImportError) as err:
            self.optimizer_error = f'{type(err).__name__}: {err}'
            return None

    @cached_property
    def is_amp(self) -> bool:
        """Whether the optim wrapper is an ``AmpOptimWrapper``."""
        from mmengine.optim import AmpOptimWrapper

        cls = self.resolve(
            self.optim_wrapper.get('type', 'OptimWrapper'), OPTIM_WRAPPERS
        )
        return isinstance(cls, type) and issubclass(cls, AmpOptimWrapper)

    @property
    def batch_size(self) -> Optional[int]:
        """``train_dataloader.batch_size`` (per GPU)."""
        loader = self.cfg.get('train_dataloader') or {}
        value = loader.get('batch_size')
        return value if isinstance(value, int) else None

    @cached_property
    def loss_entries(self) -> List[LossEntry]:
        """The loss configs of the model."""
        return find_loss_configs(self.cfg.get('model') or {}, self.scope)

    @cached_property
    def built_losses(self) -> List[Tuple[LossEntry, Optional[nn.Module]]]:
        """Each loss entry with its built module (None if it fails to
        build; the build error is then in :attr:`build_errors`)."""
        out = []
        self.build_errors: Dict[str, str] = {}
        for entry in self.loss_entries:
            try:
                out.append((entry, build_in_scope(entry.cfg, self.scope)))
            except (KeyError, TypeError, ValueError, ImportError) as err:
                self.build_errors[entry.path] = f'{type(err).__name__}: {err}'
                out.append((entry, None))
        return out

    @cached_property
    def built_model(self) -> Optional[nn.Module]:
        """The model the config builds, on the meta device (no memory, no
        initialisation), in train mode (a BatchNorm of a ``norm_eval=True``
        backbone is then in eval mode); None when it does not build (the
        error is then :attr:`model_build_error`)."""
        self.model_build_error: Optional[str] = None
        model_cfg = self.cfg.get('model')
        if not model_cfg:
            self.model_build_error = 'the config has no model'
            return None
        try:
            with torch.device('meta'):
                model = build_in_scope(model_cfg, self.scope)
        except Exception as err:  # noqa: BLE001  (said by the rules)
            self.model_build_error = f'{type(err).__name__}: {err}'
            return None
        model.train()
        return model
