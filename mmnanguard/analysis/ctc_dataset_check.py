# Copyright (c) mmnanguard contributors. All rights reserved.
"""``tools/check_dataset.py``'s CTC rule: the text labels that the
recognizer's CTC loss cannot align to its output.

A label needs one output frame per character, plus a blank between two
equal characters in a row; a longer one has an infinite CTC loss (or, with
``zero_infinity=True``, none at all). Whether a label fits depends on what
the toolbox builds: its dictionary, how its loss module cuts or pads the
target, and the output length of the recognizer for the pipeline's image
size. So the rule reads none of them from the config: when the built model
holds a ``torch.nn.CTCLoss``, every sample goes through the training
pipeline and the model's own loss forward (no backward, on the CPU), and
:class:`~mmnanguard.engine.diagnosis.ctc_alignment.CtcProbe` reports the
samples the CTC loss cannot align, with the frames their target needs and
the frames the output has.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.registry import DefaultScope
from torch import nn

from mmnanguard.config_walk import build_in_scope
from mmnanguard.engine.diagnosis.ctc_alignment import (
    CtcProbe,
    ctc_modules,
    describe_unaligned,
    name_samples,
)


class CtcAlignmentCheck:
    """Runs a sample's packed results through the model's loss forward with
    its CTC losses probed.

    Args:
        model (nn.Module): The built model (on the CPU).
        scope (str, optional): The config's ``default_scope`` (the
            forward runs in it).
    """

    #: The problem kind it reports.
    kind = 'ctc_alignment'

    def __init__(self, model: nn.Module, scope: Optional[str]) -> None:
        self.model = model
        self.scope = scope
        #: Samples run through the model.
        self.checked = 0
        #: Why the check stopped (the first forward that raised), or None.
        self.error: Optional[str] = None

    @classmethod
    def from_config(
        cls, cfg: Config
    ) -> Tuple[Optional['CtcAlignmentCheck'], Optional[str]]:
        """The check for ``cfg``'s model, when it holds a CTC loss.

        The model is first built on the meta device (no memory) to look
        for an ``nn.CTCLoss``; only then is it built on the CPU.

        Returns:
            tuple: ``(check, None)``; ``(None, None)`` when the model holds
            no CTC loss; ``(None, why)`` when it cannot be told.
        """
        model_cfg = cfg.get('model')
        if not model_cfg:
            return None, None
        scope = cfg.get('default_scope')
        try:
            with torch.device('meta'):
                found = ctc_modules(build_in_scope(model_cfg, scope))
        except Exception as err:  # noqa: BLE001  (said in the report)
            return None, (
                'CTC label lengths: the model does not build '
                f'({type(err).__name__}: {err})'
            )
        if not found:
            return None, None
        model = build_in_scope(model_cfg, scope)
        model.train()
        return cls(model, scope), None

    def check(self, packed: Dict[str, Any]) -> List[Dict[str, Any]]:
        """The samples of one pipeline output the CTC loss cannot align
        (:func:`~mmnanguard.engine.diagnosis.ctc_alignment.name_samples`
        entries, with ``line``: :func:`describe_unaligned`, and
        ``values``: target length, frames needed, frames).

        A forward that raises, or a CTC call the probe cannot read, stops
        the check; :attr:`error` says why.
        """
        if self.error is not None:
            return []
        batch = pseudo_collate([packed])
        try:
            with torch.no_grad(), CtcProbe(
                self.model
            ) as probe, DefaultScope.overwrite_default_scope(self.scope):
                data = self.model.data_preprocessor(batch, True)
                self.model(**data, mode='loss')
        except Exception as err:  # noqa: BLE001  (said in the report)
            self.error = (
                'CTC label lengths: the model forward raised on '
                f'{packed.get("data_samples")!r:.80}: '
                f'{type(err).__name__}: {err}'
            )
            return []
        if probe.error is not None:
            self.error = f'CTC label lengths: {probe.error}'
            return []
        self.checked += 1
        found = name_samples(probe.found, batch)
        for entry in found:
            entry['line'] = describe_unaligned(entry, place=False)
            entry['values'] = [
                entry['target_length'],
                entry['frames_needed'],
                entry['frames'],
            ]
        return found
