# Copyright (c) mmnanguard contributors. All rights reserved.
"""A sampling profiler of whole training iterations, without instrumenting
the code it measures.

A thread looks at the main thread's Python stack every ``interval`` seconds
and gives the wall time since its previous look to every function on that
stack (inclusive time) and to the innermost one (self time). Unlike
cProfile, which times every call and so inflates Python-heavy code far
more than torch kernels, the code measured runs unchanged: the sampler
costs both modes of a comparison the same few percent. Torch releases the
GIL in its kernels, so a look lands while a kernel runs and charges it to
the Python line that launched it.

Functions are keyed ``package/relative/path.py:function`` (the path below
``site-packages`` or below the repository), so that two runs of different
processes compare by key.
"""

import os.path as osp
import sys
import threading
import time
from collections import defaultdict
from typing import Dict, Optional

_ROOTS = tuple(
    sorted(
        {osp.dirname(osp.dirname(osp.abspath(__file__))) + osp.sep}
        | {p.rstrip(osp.sep) + osp.sep for p in sys.path if p},
        key=len,
        reverse=True,
    )
)


_KEYS: Dict[object, str] = {}


def frame_key(code) -> str:
    """``relative/path.py:function`` of a code object (cached: a look
    must cost microseconds, or the sampler slows what it measures).

    Args:
        code (types.CodeType): The frame's code.

    Returns:
        str: The key, relative to the longest ``sys.path`` entry or the
        repository that holds the file.
    """
    key = _KEYS.get(code)
    if key is not None:
        return key
    path = code.co_filename
    for root in _ROOTS:
        if path.startswith(root):
            path = path[len(root) :]
            break
    key = _KEYS[code] = f'{path}:{code.co_name}'
    return key


class StackSampler:
    """Samples the calling thread's stack from a background thread.

    Args:
        interval (float): Seconds between two looks. Defaults to 0.002.

    Examples:
        >>> sampler = StackSampler()
        >>> sampler.start()
        >>> work()
        >>> sampler.stop()
        >>> sampler.inclusive['mmengine/runner/loops.py:run_iter']
    """

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        #: key -> seconds with the function anywhere on the stack
        self.inclusive: Dict[str, float] = defaultdict(float)
        #: key -> seconds with the function innermost
        self.self_time: Dict[str, float] = defaultdict(float)
        self.sampled_s = 0.0
        self.samples = 0
        self._target: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Start sampling the thread that calls this."""
        self._target = threading.get_ident()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the sampler thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self._target)
            now = time.perf_counter()
            elapsed, last = now - last, now
            if frame is None:
                continue
            self.samples += 1
            self.sampled_s += elapsed
            self.self_time[frame_key(frame.f_code)] += elapsed
            seen = set()
            while frame is not None:
                key = frame_key(frame.f_code)
                if key not in seen:  # recursion counts once
                    seen.add(key)
                    self.inclusive[key] += elapsed
                frame = frame.f_back

    def as_dict(self) -> dict:
        """The samples as plain data (json-ready)."""
        return dict(
            interval=self.interval,
            samples=self.samples,
            sampled_s=self.sampled_s,
            inclusive=dict(self.inclusive),
            self_time=dict(self.self_time),
        )
