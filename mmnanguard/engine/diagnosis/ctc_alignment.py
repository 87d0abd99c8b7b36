# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which samples a CTC loss cannot align, found in the replay.

``torch.nn.CTCLoss`` gives ``inf`` for a sample whose target needs more
frames than its input has: one frame per label, plus one blank between two
equal labels in a row. With ``zero_infinity=False`` (torch's default, and
what mmocr's ``CTCModuleLoss`` passes) that ``inf`` becomes the batch's
loss. During the replay :class:`CtcProbe` hooks every ``nn.CTCLoss`` of
the model (whichever toolbox built it), recomputes the loss of each sample
(``reduction='none'``, in float64) from the module's own inputs and lists
the samples whose loss is not finite, with the frames their target needs
and the frames the output has.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..incident.batch_layout import sample_name, sample_sources

#: Samples listed at most per replay.
MAX_SAMPLES = 10
#: Target labels kept per listed sample.
MAX_TARGET = 64


def frames_needed(target: Sequence[int]) -> int:
    """The fewest output frames CTC needs to emit ``target``: one per
    label, plus a blank between two equal labels in a row."""
    repeats = sum(1 for a, b in zip(target, target[1:]) if a == b)
    return len(target) + repeats


def _targets_of(targets: Tensor, lengths: List[int]) -> List[List[int]]:
    """Each sample's target from CTC's padded ``(N, S)`` or concatenated
    1-D ``targets``."""
    if targets.dim() == 2:
        return [targets[i, :n].tolist() for i, n in enumerate(lengths)]
    out, start = [], 0
    flat = targets.tolist()
    for n in lengths:
        out.append(flat[start : start + n])
        start += n
    return out


def _lengths(value: Any, count: int) -> List[int]:
    if isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    return [int(v) for v in value][:count]


def ctc_modules(model: nn.Module) -> List[Tuple[str, nn.CTCLoss]]:
    """Every ``nn.CTCLoss`` of ``model``, with its name."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.CTCLoss)
    ]


def unaligned_samples(
    module: nn.CTCLoss, name: str, args: Sequence[Any]
) -> List[Dict[str, Any]]:
    """The samples of one ``CTCLoss`` call whose loss is not finite.

    Args:
        module (nn.CTCLoss): The called module (its ``blank``).
        name (str): Its name in the model.
        args (Sequence): ``(log_probs, targets, input_lengths,
            target_lengths)`` as it was called.

    Returns:
        list[dict]: Per such sample: ``module``, ``sample`` (its index in
        the batch), ``loss`` (``'inf'`` or ``'nan'``), ``frames`` (the
        output length), ``frames_needed``, ``target_length`` and
        ``target`` (the first :data:`MAX_TARGET` labels).
    """
    log_probs, targets, input_lengths, target_lengths = args[:4]
    if not isinstance(log_probs, Tensor) or not isinstance(targets, Tensor):
        return []
    count = log_probs.shape[1] if log_probs.dim() == 3 else 1
    frames = _lengths(input_lengths, count)
    lengths = _lengths(target_lengths, count)
    with torch.no_grad():
        losses = F.ctc_loss(
            log_probs.detach().double(),
            targets.detach(),
            torch.tensor(frames),
            torch.tensor(lengths),
            blank=module.blank,
            reduction='none',
            zero_infinity=False,
        ).reshape(-1)
    bad = (~torch.isfinite(losses)).nonzero().reshape(-1).tolist()
    if not bad:
        return []
    per_sample = _targets_of(targets.detach().cpu(), lengths)
    found = []
    for i in bad[:MAX_SAMPLES]:
        target = per_sample[i]
        found.append(
            dict(
                module=name,
                sample=i,
                loss='nan' if torch.isnan(losses[i]) else 'inf',
                frames=frames[i],
                frames_needed=frames_needed(target),
                target_length=len(target),
                target=target[:MAX_TARGET],
            )
        )
    return found


class CtcProbe:
    """Hooks every ``nn.CTCLoss`` of a model for one replay and collects
    :func:`unaligned_samples` of each call.

    Args:
        model (nn.Module): The replayed model.

    Attributes:
        found (list[dict]): The samples whose CTC loss was not finite.
        error (str | None): Why a call could not be checked.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.found: List[Dict[str, Any]] = []
        self.error: Optional[str] = None
        self._handles: List[Any] = []

    def __enter__(self) -> 'CtcProbe':
        for name, module in ctc_modules(self.model):
            hook = module.register_forward_hook(
                self._hook(name), with_kwargs=True
            )
            self._handles.append(hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, name: str):
        keys = ('log_probs', 'targets', 'input_lengths', 'target_lengths')

        def hook(module: Any, args: Any, kwargs: Any, out: Any) -> None:
            missing = [k for k in keys[len(args) :] if k not in kwargs]
            if missing:  # a subclass whose forward takes other arguments
                self.error = (
                    f"{name}: called without {', '.join(missing)}; its "
                    'samples were not checked'
                )
                return
            given = list(args) + [kwargs[k] for k in keys[len(args) :]]
            try:
                found = unaligned_samples(module, name, given)
            except Exception as err:  # noqa: BLE001  (the replay goes on)
                self.error = f'{name}: {type(err).__name__}: {err}'
                return
            room = MAX_SAMPLES - len(self.found)
            self.found += found[: max(room, 0)]

        return hook


def _text_of(sample: Any) -> Optional[str]:
    """The text label a data sample carries: the ``item`` string of one of
    its fields (mmocr's ``gt_text``), or None."""
    keys = getattr(sample, 'keys', None)
    if not callable(keys):
        return None
    for key in keys():
        item = getattr(getattr(sample, key, None), 'item', None)
        if isinstance(item, str):
            return item
    return None


def name_samples(
    found: List[Dict[str, Any]], data_batch: Any
) -> List[Dict[str, Any]]:
    """``found`` with each sample's file (``img_path``) and text label
    (``text``), where the batch has them.

    Args:
        found (list[dict]): :attr:`CtcProbe.found`.
        data_batch (dict): The replayed batch (``inputs``,
            ``data_samples``).
    """
    sources = sample_sources(data_batch)
    batch = data_batch if isinstance(data_batch, dict) else {}
    samples = batch.get('data_samples')
    samples = samples if isinstance(samples, (list, tuple)) else []
    named = []
    for entry in found:
        i = entry['sample']
        entry = dict(entry)
        if i < len(sources):
            entry['img_path'] = sample_name(sources[i])
        text = _text_of(samples[i]) if i < len(samples) else None
        if text is not None:
            entry['text'] = text
        named.append(entry)
    return named


def describe_unaligned(entry: Dict[str, Any], place: bool = True) -> str:
    """One line for one sample of :func:`name_samples`.

    Args:
        entry (dict): The sample.
        place (bool): Start with its file and batch index. Defaults to
            True.
    """
    text = entry.get('text')
    what = (
        f"its CTC target of {entry['target_length']} labels needs "
        f"{entry['frames_needed']} output frames, the output has "
        f"{entry['frames']} (`{entry['module']}`, loss {entry['loss']})"
    )
    if not place:
        return what if text is None else f'text {text!r}: {what}'
    shown = '' if text is None else f', text {text!r}'
    where = entry.get('img_path') or f"sample {entry['sample']}"
    return f"{where} (batch sample {entry['sample']}{shown}): {what}"
