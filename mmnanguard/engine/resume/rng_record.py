# Copyright (c) mmnanguard contributors. All rights reserved.
"""The random generators' states as checkpoint data, and back, checked.

:func:`~mmnanguard.engine.guard.rng.capture_rng_state` holds a tuple with a
numpy array (numpy) and a tuple of 625 ints (python). A checkpoint holds
them as tensors, ints and floats (:func:`rng_record`), which every loader
of the supported stacks reads without unpickling a class.
:func:`rng_state_from_record` checks a record read from a file before any
generator takes it: the Mersenne Twister keys are 624 ints below 2**32, the
position is in ``[0, 624]``, a cached gaussian is a finite float, and the
torch states are uint8 vectors of the length this torch's generators have.
A record that is not gives its problem and no state; the caller keeps the
generators as they are and says so.
"""

import math
import random
from numbers import Integral, Real
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

#: Mersenne Twister's state: 624 32-bit keys.
MT_KEYS = 624


def rng_record(state: Dict[str, Any]) -> Dict[str, Any]:
    """A state of :func:`capture_rng_state` as tensors, ints and floats.

    Args:
        state (dict): ``python``, ``numpy``, ``torch`` and optionally
            ``cuda`` states.

    Returns:
        dict: The same states, in the record's form.
    """
    version, keys, gauss = state['python']
    name, mt, pos, has_gauss, cached = state['numpy']
    record = dict(
        python=[int(version), torch.tensor(keys, dtype=torch.int64), gauss],
        numpy=[
            str(name),
            torch.from_numpy(np.asarray(mt, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
        torch=state['torch'].clone(),
    )
    if 'cuda' in state:
        record['cuda'] = [s.clone() for s in state['cuda']]
    return record


def _keys(value: Any, count: int) -> Optional[Tuple[int, ...]]:
    """``value`` as ``count`` ints in ``[0, 2**32)``, or None."""
    if not (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.int64
        and value.shape == (count,)
    ):
        return None
    if bool((value < 0).any()) or bool((value >= 2**32).any()):
        return None
    return tuple(value.tolist())


def _int_in(value: Any, low: int, high: int) -> bool:
    return (
        isinstance(value, Integral)
        and not isinstance(value, bool)
        and low <= int(value) <= high
    )


def _finite_float(value: Any) -> bool:
    return (
        isinstance(value, Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _python_state(value: Any) -> Tuple[Optional[tuple], str]:
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        return None, 'python: expected [version, 625 keys, gauss]'
    version, keys, gauss = value
    state = _keys(keys, MT_KEYS + 1)
    if version != random.getstate()[0] or state is None:
        return None, 'python: expected version 3 and 625 ints < 2**32'
    if not _int_in(state[-1], 0, MT_KEYS):
        return None, f'python: position {state[-1]} not in [0, 624]'
    if gauss is not None and not _finite_float(gauss):
        return None, f'python: gauss {gauss!r} is not a finite float'
    return (version, state, gauss), ''


def _numpy_state(value: Any) -> Tuple[Optional[tuple], str]:
    if not (isinstance(value, (list, tuple)) and len(value) == 5):
        return None, 'numpy: expected [name, 624 keys, pos, has_gauss, gauss]'
    name, keys, pos, has_gauss, cached = value
    state = _keys(keys, MT_KEYS)
    if name != 'MT19937' or state is None:
        return None, "numpy: expected 'MT19937' and 624 ints < 2**32"
    if not (
        _int_in(pos, 0, MT_KEYS)
        and _int_in(has_gauss, 0, 1)
        and _finite_float(cached)
    ):
        return None, 'numpy: position, has_gauss or gaussian out of range'
    array = np.asarray(state, dtype=np.uint32)
    return (name, array, int(pos), int(has_gauss), float(cached)), ''


def _byte_state(value: Any, like: torch.Tensor) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.uint8
        and value.shape == like.shape
    )


def _cuda_states(value: Any) -> Tuple[Optional[List[torch.Tensor]], str]:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None, 'cuda: saved by a run on a GPU; none is in use here'
    current = torch.cuda.get_rng_state_all()
    if not (
        isinstance(value, list)
        and len(value) == len(current)
        and all(_byte_state(v, c) for v, c in zip(value, current))
    ):
        return None, f'cuda: expected {len(current)} uint8 states'
    return list(value), ''


def rng_state_from_record(
    record: Any,
) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """Check a record read from a checkpoint and turn it into a state.

    Args:
        record: What the checkpoint holds (hostile until checked).

    Returns:
        tuple: The state for :func:`restore_rng_state` (None when the
        python, numpy or torch part is unusable) and the problems found;
        an unusable ``cuda`` part is left out of the state, with its
        problem.
    """
    if not isinstance(record, dict):
        return None, [f'expected a dict, got {type(record).__name__}']
    python, python_problem = _python_state(record.get('python'))
    numpy, numpy_problem = _numpy_state(record.get('numpy'))
    problems = [p for p in (python_problem, numpy_problem) if p]
    if not _byte_state(record.get('torch'), torch.get_rng_state()):
        problems.append('torch: expected the uint8 state of a CPU generator')
    if problems:
        return None, problems
    state = dict(python=python, numpy=numpy, torch=record['torch'])
    if 'cuda' in record:
        cuda, problem = _cuda_states(record['cuda'])
        if cuda is None:
            problems.append(problem)
        else:
            state['cuda'] = cuda
    return state, problems
