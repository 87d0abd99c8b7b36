# Copyright (c) mmnanguard contributors. All rights reserved.
"""A 100x loss term injected into the tiny rotated RetinaNet DOTA config:
exactly one detection, the configured action, and no detection on any of
the other (healthy) iterations of the same run.

The 200-iteration false-positive figure of the same config comes from
``benchmarks/spike_false_positives.py`` (too slow for the test suite).
"""

import glob
import json
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config
from mmnanguard.testing.spike_injection import LossSpikeInjectionHook

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(__file__))))

ITERS = 22
SPIKE_AT = 14


class Watch(Hook):
    """Weights and lr around each iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.before, self.after, self.lr = {}, {}, {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.lr[runner.iter] = runner.optim_wrapper.get_lr()['lr'][0]
        if runner.iter in (SPIKE_AT, SPIKE_AT + 1):
            self.before[runner.iter] = {
                k: v.detach().clone()
                for k, v in runner.model.state_dict().items()
            }

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        if runner.iter in (SPIKE_AT, SPIKE_AT + 1):
            self.after[runner.iter] = {
                k: v.detach().clone()
                for k, v in runner.model.state_dict().items()
            }


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())


@pytest.mark.slow
def test_injected_100x_loss_term_is_one_detection_and_skipped(
    tmp_path, tiny_dota_root
):
    guard = dict(
        type='NanGuardHook',
        lr_backoff=0.5,
        history_size=ITERS,
        spike=dict(action='skip', warmup=5),
    )
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG,
        str(tmp_path),
        tiny_dota_root,
        max_iters=ITERS,
        custom_hooks=[guard, dict(type='NanDiagnosisHook')],
    )
    cfg.merge_from_dict(
        {
            'train_dataloader.sampler': dict(type='InfiniteSampler'),
            'param_scheduler': [],
        }
    )
    runner = Runner.from_cfg(cfg)
    watch = Watch()
    runner.register_hook(watch)
    inject = LossSpikeInjectionHook([SPIKE_AT], 'loss_cls', 100.0)
    runner.register_hook(inject)
    runner.train()
    g = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert inject.injected_at == [SPIKE_AT]
    # exactly one detection, at the injected iteration; none elsewhere
    assert g.counters['spikes'] == 1 and g.counters['incidents'] == 1
    events = [
        h['iteration'] for h in g.history.to_list() if h['event'] is not None
    ]
    assert events == [SPIKE_AT]
    # the action: the update is dropped (BatchNorm running stats aside,
    # every weight unchanged), training goes on, the lr is backed off
    assert g.counters['skipped'] == 1
    params = {k for k, _ in runner.model.named_parameters()}
    before = {k: v for k, v in watch.before[SPIKE_AT].items() if k in params}
    after = {k: v for k, v in watch.after[SPIKE_AT].items() if k in params}
    assert same(before, after)
    assert not same(
        {k: v for k, v in watch.before[SPIKE_AT + 1].items() if k in params},
        {k: v for k, v in watch.after[SPIKE_AT + 1].items() if k in params},
    )
    assert watch.lr[SPIKE_AT + 1] == pytest.approx(0.5 * watch.lr[SPIKE_AT])
    (path,) = glob.glob(
        osp.join(str(tmp_path), 'nanguard', '*', 'report.json')
    )
    report = json.load(open(path))
    assert report['kind'] == 'loss_spike' and report['action'] == 'skip'
    assert report['iteration'] == SPIKE_AT
    spikes = {s['name']: s for s in report['spikes']}
    assert 'loss_cls' in spikes
    # the detected value is the injected one: 100x the term the model gave
    hist = {h['iteration']: h for h in report['history']}
    cls = [hist[i]['loss_terms']['loss_cls'] for i in range(SPIKE_AT)]
    assert spikes['loss_cls']['reference'] == pytest.approx(max(cls), rel=1e-6)
    assert spikes['loss_cls']['value'] > 10 * max(cls)
    assert [s['img_path'] for s in report['samples']]

    # the spike incident replays offline like any other kind: its folder
    # loads (kind loss_spike), and the injected spike is not in the model,
    # so the replay says it did not reproduce
    done = subprocess.run(
        [
            sys.executable,
            osp.join(REPO_ROOT, 'tools', 'replay.py'),
            osp.dirname(path),
            '--trust-config',
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'loss_spike' in done.stdout
