# Copyright (c) mmnanguard contributors. All rights reserved.
"""The battery for the losses of a config: build each one in the config's
scope, run it, and for every failing case that has a safe drop-in, run
the drop-in on the same case."""

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn

from mmnanguard.config_walk import (
    build_in_scope,
    find_loss_configs,
    is_loss_class,
    named_loss_modules,
)

from .dropins import drop_in_config
from .kinds import infer_kind
from .runner import CaseResult, battery_cases, run_case


@dataclass
class ModuleReport:
    """The battery's outcome for one loss module.

    ``drop_in_results`` holds, for each failing case, the drop-in's result
    on the same case; ``error`` says why the module could not be built or
    given inputs (then ``results`` is empty); ``skipped`` says why a module
    that was built was not exercised (it counts as no failure);
    ``exercised`` names the module the cases ran on when it is one the
    loss holds (mmocr's ``CTCModuleLoss`` holds an ``nn.CTCLoss``).
    """

    path: str
    loss_type: str
    kind: str = ''
    results: List[CaseResult] = field(default_factory=list)
    drop_in: Optional[str] = None
    drop_in_results: List[CaseResult] = field(default_factory=list)
    error: str = ''
    skipped: str = ''
    exercised: str = ''

    @property
    def failures(self) -> List[CaseResult]:
        """The failing cases."""
        return [r for r in self.results if not r.passed]

    @property
    def passed(self) -> bool:
        """Whether the module was built and passed every case."""
        return not self.error and not self.failures

    def to_dict(self) -> Dict[str, Any]:
        """The report as a JSON-ready dict."""
        return dict(
            path=self.path,
            loss_type=self.loss_type,
            kind=self.kind,
            passed=self.passed,
            error=self.error,
            skipped=self.skipped,
            exercised=self.exercised,
            drop_in=self.drop_in,
            results=[r.to_dict() for r in self.results],
            drop_in_results=[r.to_dict() for r in self.drop_in_results],
        )


def check_module(
    loss: nn.Module,
    path: str = 'loss',
    kind: Optional[str] = None,
    scope: Optional[str] = None,
    **settings,
) -> ModuleReport:
    """Run the battery on a built loss.

    Args:
        loss (nn.Module): The loss.
        path (str): Its config path.
        kind (str, optional): Input kind; inferred when None.
        scope (str, optional): The config's default scope.
        **settings: ``num_classes``, ``angle_version``, ``ignore_index``.

    Returns:
        ModuleReport: Without drop-in results.
    """
    report = ModuleReport(path, type(loss).__name__)
    try:
        report.kind = kind or infer_kind(loss, scope)
    except ValueError as err:
        inner = _known_inner_losses(loss, scope)
        if not inner:
            report.skipped = (
                f'not exercised: {err}; it holds no loss module whose '
                'inputs are known'
            )
            return report
        report.kind = ', '.join(dict.fromkeys(k for _, _, k in inner))
        report.exercised = ', '.join(
            f'{path}.{name} ({type(m).__name__})' for name, m, _ in inner
        )
        for name, module, kind in inner:
            cases = battery_cases(module, kind, scope, **settings)
            report.results += [
                run_case(module, c, f'{path}.{name}', kind) for c in cases
            ]
        return report
    cases = battery_cases(loss, report.kind, scope, **settings)
    report.results = [run_case(loss, c, path, report.kind) for c in cases]
    return report


def _known_inner_losses(
    loss: nn.Module, scope: Optional[str]
) -> List[Tuple[str, nn.Module, str]]:
    """The loss modules ``loss`` holds whose input kind can be told
    (``(name, module, kind)``; a loss inside one of them left out)."""
    found: List[Tuple[str, nn.Module, str]] = []
    for name, module in loss.named_modules():
        if not name or not is_loss_class(type(module)):
            continue
        if any(name.startswith(f'{outer}.') for outer, _, _ in found):
            continue
        try:
            found.append((name, module, infer_kind(module, scope)))
        except ValueError:
            continue
    return found


def check_loss_config(
    loss_cfg: dict,
    scope: Optional[str],
    path: str = 'loss',
    kind: Optional[str] = None,
    model: Optional[nn.Module] = None,
    **settings,
) -> ModuleReport:
    """Build a loss config in ``scope``, run the battery, and run the
    failing cases on the drop-in where there is one.

    Args:
        loss_cfg (dict): The loss config.
        scope (str, optional): Default scope to build in.
        path (str): Its config path.
        kind (str, optional): Input kind; inferred when None.
        model (nn.Module, optional): The built model: a loss that does not
            build alone (its parent passes an argument, as mmocr's
            decoders pass ``dictionary``) is taken from it at ``path``.
        **settings: ``num_classes``, ``angle_version``, ``ignore_index``.

    Returns:
        ModuleReport: The report.
    """
    try:
        loss = build_in_scope(loss_cfg, scope)
    except (KeyError, TypeError, ValueError, ImportError) as err:
        built = _from_model(model, path)
        if built is None:
            return ModuleReport(
                path,
                str(loss_cfg.get('type')),
                error=f'cannot build it: {type(err).__name__}: {err}',
            )
        loss = built  # its parent passes what it needs (a dictionary)
    report = check_module(loss, path, kind, scope, **settings)
    safe_cfg = drop_in_config(loss_cfg, type(loss))
    if safe_cfg is None or not report.failures or report.exercised:
        return report
    report.drop_in = safe_cfg['type'].split('.')[-1]
    safe = build_in_scope(safe_cfg, scope)
    by_name = {
        c.name: c for c in battery_cases(safe, report.kind, scope, **settings)
    }
    for failed in report.failures:
        case = by_name.get(failed.case)
        if case is not None:
            report.drop_in_results.append(
                run_case(
                    safe, case, f'{path} -> {report.drop_in}', report.kind
                )
            )
    return report


def check_config_losses(cfg: Any) -> List[ModuleReport]:
    """The battery for every loss of ``cfg.model``: the loss configs the
    config writes, then the loss modules the built model holds that no
    config names (a head's default ``loss_cls``, as mmaction2's
    ``TSNHead`` builds).

    Args:
        cfg (Config): A loaded config (``model``, ``default_scope``,
            optionally ``angle_version``).

    Returns:
        list[ModuleReport]: One per loss config, in config order, then one
        per loss module only the built model shows, in module order.
    """
    scope = cfg.get('default_scope')
    reports = []
    model: Optional[nn.Module] = None
    for entry in find_loss_configs(cfg.get('model') or {}, scope):
        settings = dict(entry.context)
        if cfg.get('angle_version') is not None:
            settings.setdefault('angle_version', cfg.angle_version)
        report = check_loss_config(entry.cfg, scope, entry.path, **settings)
        if report.error.startswith('cannot build it: TypeError'):
            if model is None:
                model = _built_model(cfg, scope)
            if model is not None:
                report = check_loss_config(
                    entry.cfg, scope, entry.path, model=model, **settings
                )
        reports.append(report)
    if model is None:
        model = _built_model(cfg, scope)
    if model is not None:
        reports += _unwritten_losses(model, scope, [r.path for r in reports])
    return reports


def _unwritten_losses(
    model: nn.Module, scope: Optional[str], written: List[str]
) -> List[ModuleReport]:
    """The battery for the loss modules of ``model`` at none of the
    config paths ``written`` (nor inside one), with the ``num_classes``
    of the module that holds each (read from the built head)."""
    reports = []
    # a config path indexes a list as ``[0]``, a module path as ``.0``
    written = [re.sub(r'\[(\d+)\]', r'.\1', w) for w in written]
    for path, loss in named_loss_modules(model):
        if any(path == w or path.startswith(f'{w}.') for w in written):
            continue
        settings = {}
        num_classes = _holder_num_classes(model, path)
        if num_classes is not None:
            settings['num_classes'] = num_classes
        reports.append(check_module(loss, path, scope=scope, **settings))
    return reports


def _holder_num_classes(model: nn.Module, path: str) -> Optional[int]:
    """``num_classes`` of the nearest module above ``path`` (the model
    itself last) that has an int one (a head), or None."""
    parts = path.split('.')[1:-1]  # without 'model' and the loss itself
    for end in range(len(parts), -1, -1):
        holder = model.get_submodule('.'.join(parts[:end]))
        value = getattr(holder, 'num_classes', None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _built_model(cfg: Any, scope: Optional[str]) -> Optional[nn.Module]:
    """The config's model, built on the CPU, or None when it does not
    build."""
    try:
        return build_in_scope(cfg.model, scope)
    except Exception:  # noqa: BLE001  (the loss's own error is reported)
        return None


def _from_model(model: Optional[nn.Module], path: str) -> Optional[nn.Module]:
    """The module of ``model`` at config path ``path`` (``model.a.b``)."""
    if model is None or not path.startswith('model.'):
        return None
    try:
        return model.get_submodule(path[len('model.') :])
    except AttributeError:
        return None
