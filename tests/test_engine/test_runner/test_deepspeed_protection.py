# Copyright (c) mmnanguard contributors. All rights reserved.
"""DeepSpeed runs the guard does not protect are refused when the protected
flexible runner is built (before deepspeed is touched), each in one
paragraph naming its fix; ``tools/train.py`` exits 2 with it. ZeRO-1/2 in
fp32 with rollbacks from memory is accepted."""

import os
import os.path as osp
import subprocess
import sys

import pytest

from mmnanguard.engine.runner.deepspeed_protection import (
    check_deepspeed_config,
)
from mmnanguard.engine.runner.protection import ProtectionSettings

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(__file__))))


def _strategy(**kwargs):
    return dict(type='DeepSpeedStrategy', **kwargs)


@pytest.mark.parametrize(
    'strategy, nanguard, fix',
    [
        (_strategy(), {}, 'zero_optimization=dict(stage=1)'),
        (
            _strategy(zero_optimization=dict(stage=3)),
            {},
            'zero_optimization=dict(stage=1)',
        ),
        (
            _strategy(
                zero_optimization=dict(stage=2), fp16=dict(enabled=True)
            ),
            {},
            'remove strategy.fp16',
        ),
        (
            _strategy(
                config=dict(bf16=dict(enabled=True)),
                zero_optimization=dict(stage=1),
            ),
            {},
            'remove strategy.bf16',
        ),
        (
            _strategy(
                zero_optimization=dict(stage=2, elastic_checkpoint=True)
            ),
            {},
            'remove zero_optimization.elastic_checkpoint',
        ),
        (
            _strategy(
                zero_optimization=dict(stage=2), gradient_accumulation_steps=4
            ),
            {},
            'remove strategy.gradient_accumulation_steps',
        ),
        (
            _strategy(zero_optimization=dict(stage=2)),
            dict(rollback_source='checkpoint'),
            "rollback_source='memory'",
        ),
    ],
)
def test_unprotected_deepspeed_runs_are_refused(strategy, nanguard, fix):
    with pytest.raises(ValueError) as err:
        check_deepspeed_config(
            strategy, ProtectionSettings.from_dict(nanguard)
        )
    message = str(err.value)
    assert message.startswith('nanguard: DeepSpeedStrategy: ')
    assert fix in message and "policy='off'" in message
    assert '\n' not in message


@pytest.mark.parametrize('stage', [1, 2])
def test_fp32_zero_1_and_2_are_accepted(stage):
    for strategy in (
        _strategy(zero_optimization=dict(stage=stage)),
        _strategy(config=dict(zero_optimization=dict(stage=stage))),
        _strategy(
            zero_optimization=dict(stage=stage), fp16=dict(enabled=False)
        ),
    ):
        check_deepspeed_config(strategy, ProtectionSettings.from_dict({}))
    # other strategies and an unprotected run are not its business
    check_deepspeed_config(
        dict(type='DDPStrategy'),
        ProtectionSettings.from_dict(dict(rollback_source='checkpoint')),
    )
    check_deepspeed_config(
        _strategy(zero_optimization=dict(stage=3)),
        ProtectionSettings.from_dict(dict(policy='off')),
    )


@pytest.mark.slow
def test_train_py_refuses_zero_3_with_exit_2(tmp_path):
    config = tmp_path / 'zero3.py'
    config.write_text(
        '_base_ = ["mmnanguard::_base_/nanguard.py"]\n'
        "runner_type = 'FlexibleRunner'\n"
        "strategy = dict(type='DeepSpeedStrategy',"
        ' zero_optimization=dict(stage=3))\n'
        "model = dict(type='ToyModel')\n"
        "optim_wrapper = dict(type='DeepSpeedOptimWrapper',"
        " optimizer=dict(type='SGD', lr=0.01))\n"
        'train_dataloader = dict()\n'
        'train_cfg = dict(by_epoch=False, max_iters=2)\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            osp.join(REPO, 'tools', 'train.py'),
            str(config),
            '--work-dir',
            str(tmp_path / 'work'),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ, PYTHONWARNINGS='ignore'),
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'ZeRO stage 3' in proc.stderr
    assert 'zero_optimization=dict(stage=1)' in proc.stderr
    assert 'Traceback' not in proc.stderr
