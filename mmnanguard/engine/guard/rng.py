# Copyright (c) mmnanguard contributors. All rights reserved.
"""Capture and restore the RNG states that make a replay deterministic."""

import random
from typing import Any, Dict

import numpy as np
import torch


def capture_rng_state() -> Dict[str, Any]:
    """The python, numpy, torch CPU and CUDA RNG states, right now."""
    state = dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state(),
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured."""
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])
