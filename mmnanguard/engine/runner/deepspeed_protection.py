# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the protected flexible runner adds under ``DeepSpeedStrategy``.

* :func:`check_deepspeed_config`, at start: the cases the guard does not
  protect are refused before anything is built, each in one paragraph
  naming the fix (``tools/train.py`` exits 2): ZeRO stage 0 and 3, fp16,
  bf16 and AMP, gradient accumulation in the engine, an elastic ZeRO
  checkpoint, and
  ``rollback_source='checkpoint'`` (a DeepSpeed checkpoint is a folder of
  per-rank partitions, which the rollback does not read; the in-memory
  snapshot restores ZeRO's partitions).

The check before every checkpoint covers each rank's ZeRO partitions (the
fp32 master copy and the optimizer's moments, which the wrapper's
``state_dict`` that the strategy saves from rank 0 does not hold) inside
the guard's agreement (:mod:`mmnanguard.engine.guard.save_agreement`), under
the protected runner and with the hook alone.
"""

from typing import Any, Dict, Optional

from .protection import ProtectionSettings

#: ZeRO stages the guard protects.
GUARDED_STAGES = (1, 2)

#: DeepSpeed config keys of a reduced precision, which the guard refuses.
REDUCED_PRECISION = ('fp16', 'bf16', 'amp')


def _strategy_config(strategy: Any) -> Optional[Dict[str, Any]]:
    """The DeepSpeed config of a ``DeepSpeedStrategy`` (its config dict, or
    the built strategy's ``config``); None for any other strategy."""
    if isinstance(strategy, dict):
        kind = strategy.get('type', '')
        name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
        if name.split('.')[-1] != 'DeepSpeedStrategy':
            return None
        if isinstance(strategy.get('config'), str):
            return None  # a JSON file: checked on the built strategy
        config = dict(strategy.get('config') or {})
        for key in (
            'zero_optimization',
            'gradient_accumulation_steps',
        ) + REDUCED_PRECISION:
            if strategy.get(key) is not None:
                config[key] = strategy[key]
        return config
    if type(strategy).__name__ == 'DeepSpeedStrategy':
        return dict(getattr(strategy, 'config', {}) or {})
    return None


def check_deepspeed_config(
    strategy: Any, protection: ProtectionSettings
) -> None:
    """Refuse, at start, a DeepSpeed run the guard does not protect.

    Args:
        strategy: The runner's ``strategy`` argument (a config dict or a
            built strategy); anything but ``DeepSpeedStrategy`` passes.
        protection (ProtectionSettings): The run's settings.

    Raises:
        ValueError: One paragraph naming the case and its fix.
    """
    if not protection.enabled:
        return
    config = _strategy_config(strategy)
    if config is None:
        return
    zero = config.get('zero_optimization') or {}
    stage = zero.get('stage', 0) if isinstance(zero, dict) else 0
    problem = fix = None
    if stage not in GUARDED_STAGES:
        problem = (
            f'ZeRO stage {stage} (strategy.zero_optimization.stage) is not '
            'guarded: stage 0 has no partitions to check and drop a step in, '
            'and under stage 3 the module holds 0-element placeholders '
            'outside forward, so the parameter check would see nothing'
        )
        fix = 'set strategy.zero_optimization=dict(stage=1) or dict(stage=2)'
    elif (config.get('gradient_accumulation_steps') or 1) > 1:
        problem = (
            'gradient_accumulation_steps='
            f"{config['gradient_accumulation_steps']} is not guarded: the "
            "engine's step between accumulation boundaries takes no step, "
            'which the guard would report as a skip'
        )
        fix = (
            'remove strategy.gradient_accumulation_steps (a larger '
            'train_dataloader.batch_size accumulates nothing)'
        )
    elif zero.get('elastic_checkpoint'):
        problem = (
            'zero_optimization.elastic_checkpoint=True stores the moments '
            "of every rank's partition merged, which the in-memory snapshot "
            'of one rank cannot restore'
        )
        fix = 'remove zero_optimization.elastic_checkpoint'
    else:
        reduced = [
            key
            for key in REDUCED_PRECISION
            if isinstance(config.get(key), dict)
            and config[key].get('enabled', True)
        ]
        if reduced:
            problem = (
                f'DeepSpeed {reduced[0]} is not guarded: its loss scaler '
                'skips overflowing steps itself, which the guard would '
                'report as incidents'
            )
            fix = f'remove strategy.{reduced[0]} (train in fp32)'
        elif protection.guard.get('rollback_source') == 'checkpoint':
            problem = (
                "rollback_source='checkpoint' cannot restore a DeepSpeed "
                'checkpoint: it is a folder of per-rank ZeRO partitions '
                '(zero_pp_rank_*_optim_states.pt), which the rollback does '
                "not read; the in-memory snapshot holds this rank's fp32 "
                'master copy and moments and restores them'
            )
            fix = "under DeepSpeed use nanguard.rollback_source='memory'"
    if problem is not None:
        raise ValueError(
            f'nanguard: DeepSpeedStrategy: {problem}, so the run would not '
            f'be protected. The fix: {fix}; or set '
            "nanguard.policy='off' to train without protection "
            '(docs/distributed.md, "DeepSpeed").'
        )
