# Copyright (c) mmnanguard contributors. All rights reserved.
"""What both protected runners do, whatever runner class they extend.

:class:`~.nanguard_runner.NanGuardRunner` extends mmengine's ``Runner`` and
:class:`~.nanguard_flexible_runner.NanGuardFlexibleRunner` extends
``FlexibleRunner`` (which is not a ``Runner`` subclass). Each overrides the
same methods and calls these functions after its own base class's method,
so the protection is written once; the methods both override the same way
are :class:`ProtectedRunnerMixin`'s, listed before the mmengine class in
their bases.
"""

import copy
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from mmengine.dist import master_only
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict

from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
from mmnanguard.compat.mmengine_private import (
    has_loaded,
    load_request,
    mark_loaded,
    set_train_dataloader,
    train_dataloader,
)
from mmnanguard.optional import require_packages
from mmnanguard.registry import HOOKS

from ..guard import GuardStateError
from ..hooks import NanGuardHook
from .checkpoint_fit import fit_check
from .config_dump import dump_config_durably
from .crash_safety import (
    check_load_from,
    install_crash_safety,
    resume_target,
)
from .durable_checkpoint_hook import find_checkpoint_hook
from .guarded_optim_config import guarded_optim_wrapper_cfg
from .model_facts import read_model_facts
from .preemption import PreemptionSignals, train_with_signals
from .protection import ProtectionSettings
from .resume_errors import CheckpointValueError
from .resumed_values import check_resumed_values
from .rewrite import (
    Note,
    insert_into_dataloader,
    insert_into_switch_pipelines,
    protect_built_model,
    rewrite_model_config,
    validate_transform,
)


def log(msg: str, level: int = logging.INFO) -> None:
    """Log ``msg`` as the protected runner."""
    print_log(f'nanguard: {msg}', logger='current', level=level)


def log_notes(notes: List[Note]) -> None:
    """Log each rewrite note at its level."""
    for level, note in notes:
        log(note, level)


def init_protection(
    runner: Any, nanguard: Optional[Dict[str, Any]], kwargs: Dict[str, Any]
) -> None:
    """Parse the protection settings onto ``runner`` and rewrite the model
    config in ``kwargs`` (before the base class's ``__init__``).

    Args:
        runner: The runner being built.
        nanguard (dict, optional): The settings; None reads ``cfg.nanguard``.
        kwargs (dict): The keyword arguments of the base ``__init__``;
            ``model`` is replaced by a rewritten copy.
    """
    cfg = kwargs.get('cfg') or {}
    require_packages(cfg, getattr(cfg, 'filename', None))
    if nanguard is None:
        nanguard = cfg.get('nanguard')
    runner.protection = ProtectionSettings.from_dict(nanguard)
    #: Every rewrite note (log level, message), in order.
    runner.protection_notes = []
    #: The ValidateAnnotations config inserted (None: none).
    runner.validate_transform = None
    runner._model_protected = False
    model = kwargs.get('model')
    if runner.protection.enabled and isinstance(model, dict):
        kwargs['model'] = model = copy.deepcopy(model)
        runner.protection_notes += rewrite_model_config(
            model, runner.protection, kwargs.get('default_scope')
        )


def protect_model(runner: Any, model: Any) -> Any:
    """Once per run, on the built model: check its labels and complete
    ``ValidateAnnotations`` from it in the (not yet built) training
    dataloader config.

    Args:
        runner: The runner.
        model (nn.Module): The built model (wrapped or not).

    Returns:
        nn.Module: ``model``.
    """
    if not runner.protection.enabled or runner._model_protected:
        return model
    runner._model_protected = True
    log_notes(runner.protection_notes)
    inner = model.module if is_model_wrapper(model) else model
    notes = protect_built_model(inner, runner.protection)
    transform, more = validate_transform(
        runner.protection, read_model_facts(inner)
    )
    notes += more
    loader = train_dataloader(runner)
    if isinstance(loader, dict):
        loader = copy.deepcopy(loader)
        set_train_dataloader(runner, loader)
    notes += insert_into_dataloader(loader, transform)
    runner.validate_transform = transform
    runner.protection_notes += notes
    log_notes(notes)
    return model


def guarded_optim_wrapper(runner: Any, optim_wrapper: Any) -> Any:
    """The optim wrapper config with each type replaced by its registered
    guarded counterpart (:mod:`.guarded_optim_config`) in a protected run;
    a type without one is kept, logged, and guarded by the hook's class
    swap. A built wrapper, or any wrapper in an unprotected run, is
    returned as it is.

    Args:
        runner: The protected runner.
        optim_wrapper: The ``optim_wrapper`` argument of the runner.

    Returns:
        The config to build, or ``optim_wrapper`` unchanged.
    """
    if not (runner.protection.enabled and isinstance(optim_wrapper, dict)):
        return optim_wrapper
    optim_wrapper, kept = guarded_optim_wrapper_cfg(optim_wrapper)
    if kept:
        log(
            f'optim wrapper type(s) {kept} have no registered guarded '
            'counterpart; NanGuardHook guards them by a class swap'
        )
    return optim_wrapper


def uses_amp(wrapper: Any) -> bool:
    """Whether ``wrapper`` (built, or a config dict) is an AMP wrapper."""
    if isinstance(wrapper, OptimWrapperDict):
        return any(isinstance(w, AmpOptimWrapper) for w in wrapper.values())
    if isinstance(wrapper, AmpOptimWrapper):
        return True
    if isinstance(wrapper, dict):  # not built yet: a config dict
        return 'Amp' in str(wrapper.get('type', ''))
    return False


def add_protection_hooks(runner: Any) -> None:
    """Register the ``NanGuardHook`` and the hooks of ``nanguard.hooks``
    after the config's own hooks (which are not modified).

    Args:
        runner: The runner, with its default and custom hooks registered.
    """
    if not runner.protection.enabled:
        log("policy='off': no protection added", logging.WARNING)
        return
    if any(isinstance(h, NanGuardHook) for h in runner.hooks):
        log(
            'a NanGuardHook is already in custom_hooks; it is kept and '
            'the nanguard settings are not applied',
            logging.WARNING,
        )
    else:
        runner.register_hook(NanGuardHook(**runner.protection.guard))
    amp = uses_amp(runner.optim_wrapper)
    for hook_cfg in runner.protection.hooks:
        hook_cfg = dict(hook_cfg)
        when = hook_cfg.pop('when')
        if when == 'amp' and not amp:
            continue
        hook = HOOKS.build(hook_cfg)
        if any(type(h) is type(hook) for h in runner.hooks):
            log(
                f'a {type(hook).__name__} is already configured; the '
                'one in nanguard.hooks is not added',
                logging.WARNING,
            )
            continue
        runner.register_hook(hook)
    for hook in runner.hooks:
        if isinstance(getattr(hook, 'switch_pipeline', None), list):
            hook.switch_pipeline = copy.deepcopy(hook.switch_pipeline)
    notes = insert_into_switch_pipelines(
        runner.hooks, runner.validate_transform
    )
    runner.protection_notes += notes
    log_notes(notes)
    names = [type(h).__name__ for h in runner.hooks]
    log(f'protection active, hooks in order: {names}')


def protected_load_or_resume(runner: Any, base: Callable[[], Any]) -> None:
    """``load_or_resume`` of a protected run: a resume takes the newest
    checkpoint that loads and fits the model and optimizer
    (:mod:`.checkpoint_fit`; the same on every rank), refuses a guard
    state of the wrong form, and checks the values mmengine acts on
    (:mod:`.resumed_values`) before any hook reads them; a cut-short
    ``load_from`` is refused.

    Args:
        runner: The runner.
        base (callable): The base class's ``load_or_resume``, bound.

    Raises:
        UnusableCheckpointError: No checkpoint to resume from loads and
            fits, or a ``load_from`` file is cut short.
        CheckpointValueError: ``last_checkpoint``, the resumed ``meta``
            or the guard's state is not of the form mmengine and
            mmnanguard write.
    """
    load_from, resume = load_request(runner)
    if has_loaded(runner) or not runner.protection.enabled:
        return base()
    if not resume:
        if load_from is not None:
            check_load_from(load_from)
        return base()
    path = resume_target(runner.work_dir, load_from, fit_check(runner))
    if path is not None:
        try:
            runner.resume(path)
        except GuardStateError as err:
            raise CheckpointValueError(
                f'nanguard: cannot resume from {path!r}: {err}, as the guard '
                'writes it. The file was not written by mmnanguard as it '
                'is; resume from another checkpoint with --resume CKPT.'
            ) from err
        check_resumed_values(runner, path, find_checkpoint_hook(runner))
        mark_loaded(runner)
    return None


if TYPE_CHECKING:
    from typing import TypeAlias

    from mmengine.runner import Runner

    # the mixin is put in front of Runner or FlexibleRunner (untyped: Any)
    _RunnerBase: TypeAlias = Runner
else:
    _RunnerBase = object


class ProtectedRunnerMixin(_RunnerBase):
    """The overrides that are the same in both protected runners, each
    calling the mmengine runner class that follows it in the bases.

    Example:
        >>> class NanGuardRunner(ProtectedRunnerMixin, Runner):
        ...     pass
    """

    # set by init_protection, before the base class's __init__
    protection: ProtectionSettings
    protection_notes: List[Note]
    validate_transform: Optional[Dict[str, Any]]
    _model_protected: bool
    # set by register_default_hooks
    preemption_signals: Optional[PreemptionSignals]

    @classmethod
    def from_cfg(cls, cfg: Any) -> Any:
        """Build the runner as the mmengine runner class does, after the
        CPU mend of ``launcher='pytorch'`` where this machine needs it
        (:func:`~mmnanguard.compat.cpu_distributed.prepare_cpu_distributed`;
        nothing on GPUs), so that an upstream ``tools/train.py --launcher
        pytorch`` on a config with the include runs on a CPU-only torch.

        Args:
            cfg (Config | dict): The training config.

        Returns:
            Runner | FlexibleRunner: The runner.
        """
        prepare_cpu_distributed(cfg, cfg.get('launcher', 'none'))
        return super().from_cfg(cfg)

    @property
    def agrees_before_save(self) -> bool:
        """Whether this runner's ``save_checkpoint`` has every rank check
        the state before its master-only part (a protected run); the
        ``NanGuardHook`` arranges it itself under other runners
        (:mod:`~mmnanguard.engine.guard.save_agreement`)."""
        return self.protection.enabled

    def register_hooks(
        self,
        default_hooks: Optional[Dict[str, Any]] = None,
        custom_hooks: Optional[list] = None,
    ) -> None:
        """Register the config's hooks, then the protection hooks
        (:func:`add_protection_hooks`).

        Args:
            default_hooks (dict, optional): As in ``Runner``.
            custom_hooks (list, optional): As in ``Runner``; not modified.
        """
        super().register_hooks(default_hooks, custom_hooks)
        add_protection_hooks(self)

    def register_default_hooks(
        self, hooks: Optional[Dict[str, Any]] = None
    ) -> None:
        """Register the default hooks; in a protected run, make
        ``CheckpointHook`` durable and add the ``PreemptionHook``
        (:mod:`.crash_safety`).

        Args:
            hooks (dict, optional): As in ``Runner``.
        """
        super().register_default_hooks(hooks)
        self.preemption_signals = None
        if self.protection.enabled:
            self.preemption_signals = install_crash_safety(self)

    def load_or_resume(self) -> None:
        """The base class's ``load_or_resume``; a protected resume takes the
        newest checkpoint that loads and says which and why
        (:mod:`.resume_choice`); a cut-short ``load_from`` is refused
        (:func:`protected_load_or_resume`).

        Raises:
            UnusableCheckpointError: The checkpoint named for resuming does
                not load and no other one does, or ``load_from`` is cut
                short.
        """
        return protected_load_or_resume(self, super().load_or_resume)

    def train(self) -> Any:
        """The base class's ``train``; in a protected run SIGTERM and SIGINT
        save a checkpoint at the next iteration boundary and stop training
        with ``TrainingPreempted`` (:mod:`.preemption`); the previous signal
        handlers are restored when training ends.

        Returns:
            nn.Module: The model after training.
        """
        return train_with_signals(self, super().train, log)

    @master_only
    def dump_config(self) -> None:
        """Dump the config to the work dir as the base class does; in a
        protected run durably and never through a link planted under its
        name (:func:`~.config_dump.dump_config_durably`)."""
        if not self.protection.enabled:
            return super().dump_config()
        dump_config_durably(self)
        return None
