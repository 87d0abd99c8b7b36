# Copyright (c) mmnanguard contributors. All rights reserved.
"""The samples a CTC loss cannot align, found in the replay: the frames a
target needs (counted by hand), the samples torch's own ``ctc_loss`` gives
``inf`` (``reduction='none'``), and a recognizer whose batch holds one
word longer than its output, diagnosed end to end with that word's file
and text named. The mmocr CRNN case is
``tests/test_toolboxes/test_mmocr.py``."""

import math

import pytest
import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.structures import BaseDataElement, LabelData
from torch import nn

from mmnanguard.engine.diagnosis import diagnose
from mmnanguard.engine.diagnosis.ctc_alignment import (
    CtcProbe,
    describe_unaligned,
    frames_needed,
    name_samples,
    unaligned_samples,
)
from mmnanguard.engine.diagnosis.report_md import (
    render_markdown,
    verdict_lines,
)

ALPHABET = 'abcdefghijklmnopqrstuvwxyz'


@pytest.mark.parametrize(
    'word, needed',
    [
        ('', 0),
        ('a', 1),
        ('hello', 6),  # l l
        ('aaa', 5),  # two blanks between three a's
        ('abab', 4),  # no equal neighbours
        ('bookkeeper', 13),  # oo kk ee
    ],
)
def test_frames_needed_by_hand(word, needed):
    assert frames_needed([ALPHABET.index(c) + 1 for c in word]) == needed


def _log_probs(frames, batch, classes=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(frames, batch, classes, generator=gen)
    return logits.log_softmax(-1)


#: Targets of 3 samples for 6 frames: fits, needs 7 (1 1 1 1), needs 7
#: (7 labels).
TARGETS = [[1, 2], [1, 1, 1, 1], [1, 2, 3, 4, 1, 2, 3]]


def _ctc_args(layout, frames=(6, 6, 6), targets=TARGETS):
    lengths = torch.tensor([len(t) for t in targets])
    if layout == 'padded':
        padded = torch.zeros(len(targets), max(lengths), dtype=torch.long)
        for i, t in enumerate(targets):
            padded[i, : len(t)] = torch.tensor(t)
        flat = padded
    else:
        flat = torch.tensor([v for t in targets for v in t])
    return (_log_probs(6, len(targets)), flat, torch.tensor(frames), lengths)


@pytest.mark.parametrize('layout', ['padded', 'concatenated'])
def test_the_samples_torch_gives_inf_are_listed(layout):
    args = _ctc_args(layout)
    # torch's own per-sample loss: inf exactly where a target cannot fit
    reference = F.ctc_loss(*args, reduction='none', zero_infinity=False)
    assert [math.isinf(v) for v in reference.tolist()] == [
        False,
        True,
        True,
    ]
    found = unaligned_samples(nn.CTCLoss(), 'loss.ctc', args)
    assert [(f['sample'], f['loss']) for f in found] == [
        (1, 'inf'),
        (2, 'inf'),
    ]
    assert [(f['frames'], f['frames_needed']) for f in found] == [
        (6, 7),
        (6, 7),
    ]
    assert [f['target'] for f in found] == TARGETS[1:]
    assert found[0]['module'] == 'loss.ctc'


def test_a_shorter_input_of_one_sample_counts():
    # sample 0's own input length is 1: its two labels need 2 frames
    args = _ctc_args('padded', frames=(1, 6, 6), targets=[[1, 2], [1], [2]])
    (found,) = unaligned_samples(nn.CTCLoss(), 'ctc', args)
    assert (found['sample'], found['frames'], found['frames_needed']) == (
        0,
        1,
        2,
    )


def test_the_blank_is_the_modules():
    # the module's blank index (4) is passed on; the targets (1..3) fit
    args = _ctc_args('padded', targets=[[1, 2], [3, 3], [1]])
    assert unaligned_samples(nn.CTCLoss(blank=4), 'ctc', args) == []


def test_aligned_batches_list_nothing():
    args = _ctc_args('padded', targets=[[1, 2], [3, 3], [1]])
    assert unaligned_samples(nn.CTCLoss(), 'ctc', args) == []


class Recognizer(BaseModel):
    """A toy CTC recognizer: 6 output frames from a linear layer over the
    image's columns; its targets from each sample's ``gt_text``."""

    def __init__(self, frames=6):
        super().__init__()
        self.frames = frames
        self.encoder = nn.Linear(4, len(ALPHABET) + 1)
        self.head = nn.Module()
        self.head.ctc_loss = nn.CTCLoss(zero_infinity=False)

    def forward(self, inputs, data_samples=None, mode='loss'):
        columns = torch.stack(inputs).float()[:, 0, :4, : self.frames]
        log_probs = self.encoder(columns.permute(2, 0, 1)).log_softmax(-1)
        words = [s.gt_text.item for s in data_samples]
        targets = [
            torch.tensor([ALPHABET.index(c) + 1 for c in w]) for w in words
        ]
        loss = self.head.ctc_loss(
            log_probs,
            torch.cat(targets),
            torch.full((len(words),), self.frames),
            torch.tensor([len(t) for t in targets]),
        )
        return dict(loss_ctc=loss)


def _batch(words):
    samples = []
    for i, word in enumerate(words):
        sample = BaseDataElement(metainfo=dict(img_path=f'imgs/word_{i}.png'))
        sample.gt_text = LabelData(metainfo=dict(), item=word)
        samples.append(sample)
    inputs = [torch.rand(3, 4, 8) for _ in words]
    return dict(inputs=inputs, data_samples=samples)


def test_the_probe_leaves_no_hook():
    model = Recognizer()
    with CtcProbe(model) as probe:
        model(**_batch(['abc', 'hello']))
        assert model.head.ctc_loss._forward_hooks
    assert not model.head.ctc_loss._forward_hooks
    assert probe.found == [] and probe.error is None


def _diagnosed(model, data_batch):
    """The incident report of a non-finite loss on ``data_batch``, with
    the diagnosis applied."""
    report = dict(kind='nonfinite_loss', iteration=2, history=[])
    found = diagnose(
        model,
        report,
        dict(data_batch=data_batch, rng_state=None),
        replay_state='test',
    )
    found.apply_to(report)
    return report


def test_the_unaligned_word_is_named_in_the_diagnosis():
    model = Recognizer()
    words = ['abc', 'bookkeeper', 'ok']
    data_batch = _batch(words)
    with torch.no_grad():  # the precondition: the batch's loss is inf
        assert math.isinf(model(**data_batch)['loss_ctc'].item())
    report = _diagnosed(model, data_batch)
    (entry,) = report['evidence']['replay']['ctc_unaligned']
    assert entry == dict(
        module='head.ctc_loss',
        sample=1,
        loss='inf',
        frames=6,
        frames_needed=13,
        target_length=10,
        target=[ALPHABET.index(c) + 1 for c in 'bookkeeper'],
        img_path='imgs/word_1.png',
        text='bookkeeper',
    )
    line = describe_unaligned(entry)
    assert line.startswith(
        "imgs/word_1.png (batch sample 1, text 'bookkeeper'): its CTC "
        'target of 10 labels needs 13 output frames, the output has 6'
    )
    remedy = report['diagnosis']['remedy']
    assert any('zero_infinity=False' in r for r in remedy), remedy
    assert any(
        r.startswith('CTC cannot align 1 sample(s) of this batch: ' + line)
        for r in remedy
    ), remedy
    assert report['diagnosis']['verdict'] == verdict_lines(report)


def test_name_samples_without_files_or_text():
    found = [
        dict(
            sample=0,
            module='ctc',
            loss='inf',
            frames=2,
            frames_needed=3,
            target_length=3,
            target=[1, 2, 3],
        )
    ]
    (entry,) = name_samples(found, dict(inputs=None, data_samples=None))
    assert 'img_path' not in entry and 'text' not in entry
    assert describe_unaligned(entry).startswith('sample 0 (batch sample 0)')


class LengthlessCTCLoss(nn.CTCLoss):
    """A user's CTC loss that takes padded targets only and works out the
    lengths itself: the probe cannot read a call of this form."""

    def forward(self, log_probs, targets):
        frames = torch.full((log_probs.shape[1],), log_probs.shape[0])
        lengths = (targets > 0).sum(1)
        return super().forward(log_probs, targets, frames, lengths)


def test_a_call_the_probe_cannot_read_is_said_in_the_report():
    model = Recognizer()
    model.head.ctc_loss = LengthlessCTCLoss()

    def forward(inputs, data_samples=None, mode='loss'):
        columns = torch.stack(inputs).float()[:, 0, :4, : model.frames]
        log_probs = model.encoder(columns.permute(2, 0, 1)).log_softmax(-1)
        targets = torch.zeros(len(data_samples), 10, dtype=torch.long)
        for i, sample in enumerate(data_samples):
            word = [ALPHABET.index(c) + 1 for c in sample.gt_text.item]
            targets[i, : len(word)] = torch.tensor(word)
        return dict(loss_ctc=model.head.ctc_loss(log_probs, targets))

    model.forward = forward
    data_batch = _batch(['abc', 'bookkeeper'])
    report = _diagnosed(model, data_batch)
    replay = report['evidence']['replay']
    # the replay itself ran: the loss is inf, as torch computes it
    assert replay['loss_terms']['loss_ctc'] == 'inf'
    assert replay['ctc_unaligned'] == []
    assert replay['ctc_error'] == (
        'head.ctc_loss: called without input_lengths, target_lengths; its '
        'samples were not checked'
    )
    assert '  - CTC alignment of the samples not checked: ' + replay[
        'ctc_error'
    ] in render_markdown(report)
