# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which module of the model a loss term comes from, and our drop-in for
it.

The loss modules are found in the built model, not in the config: a term
``loss_bbox`` is computed by the submodule whose ``loss_name`` (mmseg) or
attribute name (mmdet, mmrotate) is ``loss_bbox``; ``loss_rpn_cls`` by
``rpn_head.loss_cls``. Box coders are task utilities, not modules: they
are found as the ``bbox_coder`` attribute of a head.
"""

from typing import Any, Dict, List, Optional

from torch import nn

from .probe import is_loss_module

#: Upstream class -> the mmnanguard drop-in (same arguments).
DROP_INS = dict(
    GDLoss='SafeGDLoss',
    FocalLoss='StableFocalLoss',
    RotatedIoULoss='SafeRotatedIoULoss',
    DiceLoss='SafeDiceLoss',
    DeltaXYWHTRBBoxCoder='SafeDeltaXYWHTRBBoxCoder',
)
#: The include that swaps every module above for its drop-in.
SAFE_MODULES_INCLUDE = 'mmnanguard::_base_/safe_modules.py'


def _entry(name: str, obj: Any, term: Optional[str] = None) -> Dict[str, Any]:
    kind = type(obj).__name__
    entry: Dict[str, Any] = dict(
        term=term,
        module=name,
        type=kind,
        config_path=f'model.{name}',
        drop_in=DROP_INS.get(kind),
    )
    ctc = _ctc_loss(name, obj)
    if ctc is not None:  # the module is, or holds, a torch CTCLoss
        entry['ctc'] = ctc
    return entry


def _ctc_loss(name: str, obj: Any) -> Optional[Dict[str, Any]]:
    """Where a torch ``CTCLoss`` is in ``obj`` (itself or a submodule)
    and its ``zero_infinity``; the config path of the module that takes
    ``zero_infinity`` (the owner of the ``CTCLoss``)."""
    if not isinstance(obj, nn.Module):
        return None
    for sub, module in obj.named_modules(prefix=name):
        if isinstance(module, nn.CTCLoss):
            owner = sub.rpartition('.')[0]
            return dict(
                module=sub,
                zero_infinity=bool(module.zero_infinity),
                config_path=f'model.{owner}' if owner else 'model',
            )
    return None


def _term_matches(term: str, name: str, module: nn.Module) -> bool:
    leaf = term.rsplit('.', 1)[-1]  # mmseg: 'decode.loss_ce'
    if getattr(module, 'loss_name', None) == leaf:
        return True
    attr = name.rsplit('.', 1)[-1]
    if leaf.startswith('loss_rpn_'):  # mmdet: rpn_head.loss_cls
        rpn = 'loss_' + leaf[len('loss_rpn_') :]
        return attr == rpn and 'rpn' in name
    return attr == leaf and 'rpn' not in name


def loss_modules(model: nn.Module, terms: List[str]) -> List[Dict[str, Any]]:
    """The loss module of each term, as found in the model.

    Args:
        model (nn.Module): The model (a wrapper's ``module``).
        terms (list[str]): Loss term names (``'loss'``, the total, is
            skipped).

    Returns:
        list[dict]: Per term found: ``term``, ``module`` (its name in the
        model), ``type``, ``config_path`` (``model.bbox_head.loss_bbox``)
        and ``drop_in`` (None when mmnanguard has none).
    """
    found = []
    candidates = [
        (n, m) for n, m in model.named_modules() if n and is_loss_module(n, m)
    ]
    for term in terms:
        if term == 'loss':
            continue
        for name, module in candidates:
            if _term_matches(term, name, module):
                found.append(_entry(name, module, term))
                break
    return found


def box_coders(model: nn.Module) -> List[Dict[str, Any]]:
    """The ``bbox_coder`` of every head that has one (``module`` is e.g.
    ``bbox_head.bbox_coder``)."""
    found = []
    for name, module in model.named_modules():
        coder = getattr(module, 'bbox_coder', None)
        if coder is not None and not isinstance(coder, nn.Module):
            found.append(
                _entry(f'{name}.bbox_coder' if name else 'bbox_coder', coder)
            )
    return found


def module_entry(model: nn.Module, name: str) -> Dict[str, Any]:
    """:func:`loss_modules`' entry for the module ``name`` of ``model``."""
    return _entry(name, model.get_submodule(name))
