# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmocr's CRNN (MiniVGG + BiLSTM, ``CTCModuleLoss``) and DBNet (ResNet-18
+ FPNC + ``DBHead``) model-zoo configs through the include, on generated
text images (mmocr's own annotation format, read by its ``OCRDataset``
through the config's ``ConcatDataset``/pipelines), with a NaN gradient
planted at iteration 1; then CRNN with nothing planted and one label
that CTC cannot align to the recognizer's output: ``loss_ctc`` is
``inf`` (the config keeps ``zero_infinity=False``), which puts NaN into
the weights of an unguarded run and is skipped by the guarded one."""

import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from stack_marks import needs_mmocr
from toolbox_runs import (
    BATCH,
    check_protected_run,
    load_tool,
    train_protected,
    upstream_config,
)

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import tensors_all_finite

pytestmark = [pytest.mark.stack_smoke, needs_mmocr]

CRNN = 'textrecog/crnn/crnn_mini-vgg_5e_mj.py'
DBNET = 'textdet/dbnet/dbnet_resnet18_fpnc_1200e_icdar2015.py'
NRTR = 'textrecog/nrtr/nrtr_modality-transform_6e_st_mj.py'
PANET = 'textdet/panet/panet_resnet18_fpem-ffm_600e_icdar2015.py'

#: Words of the recognition set (lower-case letters and digits: CRNN's
#: dictionary, ``lower_english_digits.txt``).
WORDS = ['hello', 'world', 'text', 'crnn', 'ocr42', 'guard']
#: CRNN's output length for its 100x32 input: MiniVGG gives W/4 + 1 = 26
#: columns.
CRNN_SEQ_LEN = 26
#: A label CTC cannot align to 26 output columns: ``CTCModuleLoss`` cuts
#: every label to the output length, but each of the repeated letters of
#: the 26 kept (``oo``, ``kk``, ``ee``) needs a blank between its two
#: frames, 34 frames in all.
UNALIGNABLE = 'bookkeeper' * 3


def write_textrecog_set(root, words):
    """Word images of 100x32 pixels and ``textrecog_train.json``
    (mmocr's format: ``img_path`` and ``instances=[dict(text=...)]``).

    Returns:
        list[str]: The image paths, in the order of ``words``.
    """
    os.makedirs(osp.join(root, 'imgs'), exist_ok=True)
    rng = np.random.default_rng(0)
    data_list, paths = [], []
    for i, word in enumerate(words):
        img = rng.integers(170, 255, size=(32, 100, 3), dtype=np.uint8)
        cv2.putText(
            img, word[:8], (4, 23), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 2
        )
        name = f'imgs/word_{i}.png'
        cv2.imwrite(osp.join(root, name), img)
        paths.append(osp.join(root, name))
        data_list.append(dict(img_path=name, instances=[dict(text=word)]))
    ann = dict(
        metainfo=dict(dataset_type='TextRecogDataset', task_name='textrecog'),
        data_list=data_list,
    )
    with open(osp.join(root, 'textrecog_train.json'), 'w') as f:
        json.dump(ann, f)
    return paths


def write_textdet_set(root, num_images=6, side=128):
    """Images of ``side`` x ``side`` pixels with two or three words each
    and ``textdet_train.json`` (mmocr's format: per word a quadrilateral
    ``polygon``, its ``bbox``, ``bbox_label=0``, ``ignore=False``)."""
    os.makedirs(osp.join(root, 'imgs'), exist_ok=True)
    rng = np.random.default_rng(0)
    data_list = []
    for i in range(num_images):
        img = rng.integers(150, 255, size=(side, side, 3), dtype=np.uint8)
        instances = []
        for row in range(2 + i % 2):
            word = WORDS[(i + row) % len(WORDS)]
            x, y = 8 + 6 * row, 12 + 38 * row
            (w, h), base = cv2.getTextSize(
                word, cv2.FONT_HERSHEY_SIMPLEX, 0.8, 2
            )
            cv2.putText(
                img,
                word,
                (x, y + h),
                cv2.FONT_HERSHEY_SIMPLEX,
                0.8,
                (20, 20, 20),
                2,
            )
            x1, y1, x2, y2 = x - 2, y - 2, x + w + 2, y + h + base + 2
            instances.append(
                dict(
                    polygon=[x1, y1, x2, y1, x2, y2, x1, y2],
                    bbox=[x1, y1, x2, y2],
                    bbox_label=0,
                    ignore=False,
                )
            )
        name = f'imgs/img_{i}.jpg'
        cv2.imwrite(osp.join(root, name), img)
        data_list.append(
            dict(img_path=name, height=side, width=side, instances=instances)
        )
    ann = dict(
        metainfo=dict(
            dataset_type='TextDetDataset',
            task_name='textdet',
            category=[dict(id=0, name='text')],
        ),
        data_list=data_list,
    )
    with open(osp.join(root, 'textdet_train.json'), 'w') as f:
        json.dump(ann, f)


@pytest.fixture(scope='module')
def textrecog_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('tiny_textrecog'))
    write_textrecog_set(root, WORDS)
    return root


@pytest.fixture(scope='module')
def textdet_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('tiny_textdet'))
    write_textdet_set(root)
    return root


def shrink_crnn(data_root):
    """The generated words as the only set of the config's
    ``ConcatDataset`` (its MJSynth entry, ``textrecog_train.json``); the
    model and the 100x32 pipeline as upstream has them."""

    def shrink(cfg):
        (mjsynth,) = cfg.train_dataloader.dataset.datasets
        mjsynth.data_root = data_root
        # mmocr's VisualizationHook draws nothing in training; it takes no
        # `draw` switch (which shrink_runtime sets on mmdet's)
        cfg.default_hooks.pop('visualization')

    return shrink


def shrink_dbnet(data_root, side=128):
    """ResNet-18 at a quarter of its widths, FPNC and DBHead to match, no
    pretrained weights; the config's augmentations with its 640x640
    resize and pad at ``side``."""

    def shrink(cfg):
        model = cfg.model
        model.backbone.update(base_channels=16, init_cfg=None)
        model.neck.update(
            in_channels=[16, 32, 64, 128], lateral_channels=32, out_channels=8
        )
        model.det_head.in_channels = 32
        dataset = cfg.train_dataloader.dataset
        for transform in dataset.pipeline:
            if transform['type'] == 'Resize':
                transform['scale'] = (side, side)
            if transform['type'] == 'Pad':
                transform['size'] = (side, side)
        dataset.data_root = data_root
        cfg.default_hooks.pop('visualization')

    return shrink


def shrink_nrtr(data_root):
    """NRTR (modality transform, transformer encoder and decoder, an
    attention recognizer whose ``CEModuleLoss`` holds a cross-entropy of
    character indices) with one encoder and one decoder layer; the
    generated words as the only set of its ``ConcatDataset``."""

    def shrink(cfg):
        cfg.model.encoder.n_layers = 1
        cfg.model.decoder.n_layers = 1
        dataset = cfg.train_dataloader.dataset
        dataset.datasets = [dataset.datasets[0]]
        dataset.datasets[0].data_root = data_root
        cfg.default_hooks.pop('visualization')

    return shrink


def shrink_panet(data_root, side=128):
    """PANet's ResNet-18 at a quarter of its widths (stem 32), FPEM-FFM
    and PANHead to match, no pretrained weights; its 736-px jitter, crop
    and pad at ``side``."""

    def shrink(cfg):
        model = cfg.model
        model.backbone.update(
            base_channels=16, stem_channels=32, init_cfg=None
        )
        model.neck.update(in_channels=[16, 32, 64, 128], conv_out=32)
        model.det_head.update(in_channels=[32] * 4, hidden_dim=32)
        dataset = cfg.train_dataloader.dataset
        for transform in dataset.pipeline:
            if transform['type'] == 'ShortScaleAspectJitter':
                transform['short_size'] = side
            if transform['type'] in ('TextDetRandomCrop', 'Pad'):
                key = 'target_size' if 'target_size' in transform else 'size'
                transform[key] = (side, side)
        dataset.data_root = data_root
        cfg.default_hooks.pop('visualization')

    return shrink


def test_crnn_protected(tmp_path, textrecog_root):
    run = train_protected(
        tmp_path, upstream_config('mmocr', CRNN), shrink_crnn(textrecog_root)
    )
    report = check_protected_run(run)
    runner = run['runner']
    # the layout: mmocr's TextRecogDataSample, the config's ConcatDataset
    assert type(runner.train_dataloader.dataset).__name__ == 'ConcatDataset'
    assert type(runner.model.decoder.module_loss).__name__ == 'CTCModuleLoss'
    assert all(
        f.startswith(osp.join(textrecog_root, 'imgs', 'word_'))
        for f in (s['img_path'] for s in report['samples'])
    )


def test_dbnet_protected(tmp_path, textdet_root):
    run = train_protected(
        tmp_path,
        upstream_config('mmocr', DBNET),
        shrink_dbnet(textdet_root),
    )
    report = check_protected_run(run)
    runner = run['runner']
    assert type(runner.model.det_head.module_loss).__name__ == 'DBModuleLoss'
    assert runner.model.backbone.conv1.out_channels == 16
    assert all(
        f.startswith(osp.join(textdet_root, 'imgs', 'img_'))
        for f in (s['img_path'] for s in report['samples'])
    )


def test_nrtr_protected(tmp_path, textrecog_root):
    """An attention recognizer: the planted fault skipped, and the
    cross-entropy inside ``CEModuleLoss`` gets the label check."""
    run = train_protected(
        tmp_path, upstream_config('mmocr', NRTR), shrink_nrtr(textrecog_root)
    )
    report = check_protected_run(run)
    runner = run['runner']
    loss = runner.model.decoder.module_loss
    assert type(loss).__name__ == 'CEModuleLoss'
    assert loss.loss_ce._nanguard_label_check is True
    assert len(runner.model.encoder.layer_stack) == 1
    assert all(
        f.startswith(osp.join(textrecog_root, 'imgs', 'word_'))
        for f in (s['img_path'] for s in report['samples'])
    )


def test_panet_protected(tmp_path, textdet_root):
    run = train_protected(
        tmp_path, upstream_config('mmocr', PANET), shrink_panet(textdet_root)
    )
    report = check_protected_run(run)
    runner = run['runner']
    assert type(runner.model.det_head.module_loss).__name__ == 'PANModuleLoss'
    assert runner.model.backbone.stem[0].out_channels == 16
    assert all(
        f.startswith(osp.join(textdet_root, 'imgs', 'img_'))
        for f in (s['img_path'] for s in report['samples'])
    )


def test_crnn_unalignable_label(tmp_path, capsys):
    """Nothing planted: one word's label needs more CTC frames than CRNN
    has; its batch's ``loss_ctc`` is inf."""
    root = str(tmp_path / 'data')
    words = WORDS[:5] + [UNALIGNABLE]
    paths = write_textrecog_set(root, words)
    bad_file = paths[-1]
    upstream = upstream_config('mmocr', CRNN)
    runs = {}
    for name, include in (
        ('plain', None),
        ('guarded', 'mmnanguard::_base_/nanguard.py'),
    ):
        work_dir = tmp_path / name
        work_dir.mkdir()
        runs[name] = train_protected(
            work_dir, upstream, shrink_crnn(root), include=include, fault=None
        )

    plain = runs['plain']
    # the precondition: CRNN's output length, and the word is in this run
    runner = plain['runner']
    assert runner.model.decoder.module_loss.ctc_loss.zero_infinity is False
    with torch.no_grad():
        feat = runner.model.backbone(torch.zeros(1, 1, 32, 100))
    assert feat.shape[-1] == CRNN_SEQ_LEN
    # unguarded, the weights and the checkpoint take the non-finite update
    assert not tensors_all_finite(plain['checkpoint']['state_dict'])
    assert not all(
        torch.isfinite(p).all() for p in plain['recorder'].params[-1].values()
    )

    run = runs['guarded']
    runner = run['runner']
    order = list(iter(runner.train_dataloader.sampler))
    bad_iter = order.index(len(words) - 1) // BATCH
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['incidents'] == 1
    assert guard.counters['skipped'] == 1
    (report,) = run['reports']
    assert report['iteration'] == bad_iter
    assert report['action'] == 'skip'
    assert report['kind'] == 'nonfinite_loss'
    assert report['nonfinite_terms'] == dict(loss='inf', loss_ctc='inf')
    # the live iteration and the replay place it in the loss: the CTC
    # module's output is the first non-finite value
    assert report['stage'] == 'loss'
    assert report['reproduced'] is True
    first = report['evidence']['replay']['loss_first']
    assert (first['module'], first['type']) == (
        'decoder.module_loss.ctc_loss',
        'CTCLoss',
    )
    assert (first['posinf'], first['inputs_finite']) == (1, True)
    # the remedy is CTC's own: zero_infinity, on the module that takes it
    remedy = report['diagnosis']['remedy']
    assert any(
        'CTC loss with zero_infinity=False' in line
        and '`model.decoder.module_loss.zero_infinity=True`' in line
        for line in remedy
    ), remedy
    # the replay names the word CTC cannot align: its file, its text, the
    # frames its cut target needs (26 labels + 8 repeated neighbours) and
    # the 26 CRNN has
    (entry,) = report['evidence']['replay']['ctc_unaligned']
    assert (entry['img_path'], entry['text']) == (bad_file, UNALIGNABLE)
    assert entry['module'] == 'decoder.module_loss.ctc_loss'
    assert (entry['target_length'], entry['frames_needed']) == (26, 34)
    assert entry['frames'] == CRNN_SEQ_LEN
    assert any(
        line.startswith('CTC cannot align 1 sample(s)') and bad_file in line
        for line in remedy
    ), remedy
    # the batch's files, the word's among them
    files = [s['img_path'] for s in report['samples']]
    assert files == [
        runner.train_dataloader.dataset.get_data_info(i)['img_path']
        for i in order[bad_iter * BATCH : (bad_iter + 1) * BATCH]
    ]
    assert bad_file in files
    # the skipped step left every parameter as it was
    recorder = run['recorder']
    before = recorder.params[bad_iter - 1] if bad_iter else recorder.initial
    after = recorder.params[bad_iter]
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(value, after[name]), name
    assert all(torch.isfinite(p).all() for p in recorder.params[-1].values())
    checkpoint = run['checkpoint']
    assert tensors_all_finite(checkpoint['state_dict'])
    assert tensors_all_finite(checkpoint['optimizer'])
    assert checkpoint['nanguard']['counters']['skipped'] == 1
    # the line report.md gives: tools/replay.py INCIDENT --config CFG
    # loads mmocr's TextRecogDataSample and finds the same word
    with open(osp.join(report['folder'], 'report.md')) as f:
        assert '--config CFG' in f.read()
    config = str(tmp_path / 'replay_config.py')
    runner.cfg.dump(config)
    capsys.readouterr()
    code = load_tool('replay').main([report['folder'], '--config', config])
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'CTC cannot align 1 sample(s)' in out and bad_file in out
    assert '`decoder.module_loss.ctc_loss`' in out


def test_check_dataset_finds_the_label_ctc_cannot_align(tmp_path, capsys):
    """``tools/check_dataset.py`` on the shrunk CRNN config: every word
    goes through the pipeline and CRNN's loss forward; the one whose CTC
    target needs 34 frames of the 26 is the only problem, named by its
    file and text."""
    from mmengine.config import Config

    tool = load_tool('check_dataset')
    root = str(tmp_path / 'data')
    words = WORDS[:5] + [UNALIGNABLE]
    paths = write_textrecog_set(root, words)
    cfg = Config.fromfile(upstream_config('mmocr', CRNN))
    shrink_crnn(root)(cfg)
    config = str(tmp_path / 'crnn.py')
    cfg.dump(config)
    out = str(tmp_path / 'scan.json')
    code = tool.main([config, '--no-progress', '--out', out])
    stdout = capsys.readouterr().out
    assert code == 1, stdout
    with open(out) as f:
        report = json.load(f)
    assert report['sample_checks'] == dict(ctc_alignment=len(words))
    (problem,) = report['problems']
    assert problem['kind'] == 'ctc_alignment'
    assert problem['file'] == paths[-1]
    assert problem['values'] == [26, 34, CRNN_SEQ_LEN]
    assert f'text {UNALIGNABLE!r}' in problem['detail']
    assert 'Also checked: ctc_alignment, 6 sample(s)' in stdout


def test_check_loss_exercises_crnns_ctc_and_dbnets_inner_losses(
    tmp_path, capsys
):
    """``tools/check_loss.py`` on mmocr's configs as upstream has them:
    CRNN's ``CTCModuleLoss`` (which does not build without the decoder's
    dictionary) is taken from the built model and its ``CTCLoss`` gets
    CTC's cases, the two unalignable targets failing until
    ``zero_infinity=True``; DBNet's ``DBModuleLoss`` is exercised through
    the three losses it holds."""
    tool = load_tool('check_loss')
    out = str(tmp_path / 'crnn.json')
    crnn = upstream_config('mmocr', CRNN)
    assert tool.main([crnn, '--json', out]) == 1
    with open(out) as f:
        (report,) = json.load(f)
    assert report['error'] == '' and report['kind'] == 'ctc'
    failing = [r['case'] for r in report['results'] if not r['passed']]
    assert failing == [
        'a target longer than the 12 output frames',
        '7 equal labels (need 13 frames with the blanks between them)',
    ]
    fixed = ['--cfg-options', 'model.decoder.module_loss.zero_infinity=True']
    assert tool.main([crnn, *fixed]) == 0
    out = str(tmp_path / 'dbnet.json')
    tool.main([upstream_config('mmocr', DBNET), '--json', out])
    with open(out) as f:
        (report,) = json.load(f)
    assert report['error'] == '' and report['skipped'] == ''
    assert {r['path'].rsplit('.', 1)[-1] for r in report['results']} == {
        'loss_prob',
        'loss_thr',
        'loss_db',
    }
    assert 'the cases ran on the loss it holds' in capsys.readouterr().out
