# Copyright (c) mmnanguard contributors. All rights reserved.
"""Count the device->host reads and the collectives of training iterations.

On a GPU every host read of a device value (``.item()``, ``float(t)``,
``bool(t)``, ``int(t)``, ``.tolist()``, ``.cpu()``) and every operator whose
output shape depends on the data (``nonzero``, boolean-mask indexing, ...)
waits for the device queue to drain. On the CPU the same calls can be
counted exactly, which makes the count a deterministic number that a test
can pin. :func:`count_host_syncs` counts, while it is active:

* **scalar reads**, seen by a ``TorchDispatchMode``: every
  ``aten::_local_scalar_dense`` (what ``.item()``, ``float(t)``,
  ``bool(t)``, ``int(t)`` and ``torch.is_nonzero`` call), plus the
  operators that return a Python bool computed from tensor values
  (:data:`BOOL_RESULT_OPS`: ``torch.equal``, ``torch.allclose``);
* **data-dependent shapes** (:data:`DATA_DEPENDENT_OPS`, seen by the same
  mode): ``nonzero`` (and so ``torch.where(cond)``, ``argwhere``),
  ``masked_select``, every ``unique`` kernel, ``bincount``,
  ``repeat_interleave`` without ``output_size``, and ``index`` /
  ``index_put`` with a boolean or uint8 index (``t[mask]``,
  ``t[mask] = v``);
* **host copies**, seen by patching the ``torch.Tensor`` methods
  (:data:`HOST_COPY_METHODS`: ``tolist``, ``numpy``, ``cpu``), which do not
  reach the dispatcher for a CPU tensor, and, for a tensor on an
  accelerator, ``aten::_to_copy`` / ``aten::copy_`` from the device to the
  CPU. On the CPU a tensor cannot be told apart from one that would live
  on the GPU, so with ``host_tensors=True`` (the default, for CPU runs)
  every call of the methods counts; pass ``host_tensors=False`` on a GPU
  to count only those of device tensors;
* **collectives**: every operator of the ``c10d`` namespaces
  (``c10d::allreduce_``, ``c10d::broadcast_``, ``c10d::allgather_``,
  ``c10d::barrier``, ...), which ``torch.distributed``'s Python functions
  and DDP's gradient reducer both dispatch to (verified on torch 2.13 with
  gloo; no patching of ``torch.distributed`` needed).

Each event is attributed to the first stack frame outside torch, this
module and mmengine's thin ``torch.distributed`` wrappers
(``mmengine/dist/``), as ``file:line`` relative to the repository or
``site-packages`` (e.g. ``mmengine/optim/optimizer/optimizer_wrapper.py:
201``); an event with no such frame (an autograd worker thread) is
``<torch>``. Inside mmengine's
train loops (``EpochBasedTrainLoop`` / ``IterBasedTrainLoop``), each
``run_iter`` call (the ``before_train_iter`` hooks, ``train_step`` and the
``after_train_iter`` hooks; not the data loading) is one iteration of
:attr:`SyncCounts.iterations`.

Not counted: host->device copies (``torch.tensor(x, device='cuda')`` is a
sync on a GPU too, and ``torch.cuda.set_sync_debug_mode`` reports it),
reads inside C++ extension kernels that never call an ATen operator, and
work in dataloader worker processes.

Example:
    >>> with count_host_syncs() as counts:
    ...     x = torch.ones(3)
    ...     x.sum().item()
    ...     x.tolist()
    >>> counts.reads
    2
"""

import contextlib
import os
import os.path as osp
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: ``aten`` operators that copy a value from the tensor to the host.
SCALAR_READ_OPS = frozenset({'aten::_local_scalar_dense'})
#: Operators that return a Python bool computed from the tensors' values.
BOOL_RESULT_OPS = frozenset({'aten::equal', 'aten::allclose'})
#: Operators whose output shape depends on the values of their input: on a
#: GPU the host must read a count before it can allocate the output.
DATA_DEPENDENT_OPS = frozenset(
    {
        'aten::nonzero',
        'aten::masked_select',
        'aten::_unique',
        'aten::_unique2',
        'aten::unique_dim',
        'aten::unique_consecutive',
        'aten::unique_dim_consecutive',
        'aten::bincount',
    }
)
#: Indexing operators that are data dependent with a boolean/uint8 index.
MASK_INDEX_OPS = frozenset(
    {
        'aten::index',
        'aten::index_put',
        'aten::index_put_',
        'aten::_index_put_impl_',
    }
)
#: ``torch.Tensor`` methods that copy the tensor to the host.
HOST_COPY_METHODS = ('tolist', 'numpy', 'cpu')
#: Collective namespaces; operators that only wait are not collectives.
COLLECTIVE_NAMESPACES = ('c10d::', '_c10d_functional::', 'c10d_functional::')
NOT_COLLECTIVES = frozenset(
    {'_c10d_functional::wait_tensor', 'c10d_functional::wait_tensor'}
)

#: Event categories: ``scalar`` (``_local_scalar_dense`` and bool-result
#: operators), ``shape`` (data-dependent shapes), ``copy`` (host copies)
#: are reads; ``collective`` is a collective.
READ_CATEGORIES = ('scalar', 'shape', 'copy')

_TORCH_DIR = osp.dirname(osp.abspath(torch.__file__)) + os.sep
_THIS_FILE = osp.abspath(__file__)
_PACKAGE_ROOT = osp.dirname(osp.dirname(osp.dirname(_THIS_FILE)))
_SITE_DIRS = ('site-packages', 'dist-packages')
#: Frames attributed to their caller: mmengine's torch.distributed wrappers.
_PASS_THROUGH = (os.sep + osp.join('mmengine', 'dist') + os.sep,)


@dataclass
class SyncCounts:
    """Events counted by :func:`count_host_syncs`.

    Attributes:
        events (Counter): ``(category, site) -> count`` over the whole
            counting window.
        iterations (list[Counter]): The same per training iteration (one
            per ``run_iter`` of an mmengine train loop), in order.
    """

    events: Counter = field(default_factory=Counter)
    iterations: List[Counter] = field(default_factory=list)

    @property
    def reads(self) -> int:
        """Host reads over the whole window (every read category)."""
        return _total(self.events, READ_CATEGORIES)

    @property
    def collectives(self) -> int:
        """Collectives over the whole window."""
        return _total(self.events, ('collective',))

    def category(self, name: str) -> int:
        """Events of one category (``'scalar'``, ``'shape'``, ``'copy'``,
        ``'collective'``) over the whole window."""
        return _total(self.events, (name,))

    def sites(self, kind: str = 'reads') -> Counter:
        """``site -> count`` over the whole window.

        Args:
            kind (str): ``'reads'`` or ``'collectives'``.
        """
        return _sites(self.events, _categories(kind))

    def per_iteration(self, skip: int = 2) -> Dict[str, Any]:
        """Means per iteration over the iterations after the first
        ``skip`` (the steady state).

        Args:
            skip (int): Leading iterations left out. Defaults to 2.

        Returns:
            dict: ``iterations`` (how many were averaged), ``reads``,
            ``collectives``, ``categories`` (category -> mean),
            ``read_sites`` and ``collective_sites`` (site -> mean), and
            ``reads_each`` / ``collectives_each`` (the count of each
            averaged iteration).

        Raises:
            ValueError: No iteration is left after ``skip``.
        """
        kept = self.iterations[skip:]
        if not kept:
            raise ValueError(
                f'{len(self.iterations)} iterations counted; none is left '
                f'after skipping {skip}'
            )
        n = len(kept)
        total: Counter = Counter()
        for it in kept:
            total.update(it)
        categories = Counter()
        for (cat, _), count in total.items():
            categories[cat] += count
        return dict(
            iterations=n,
            reads=_total(total, READ_CATEGORIES) / n,
            collectives=_total(total, ('collective',)) / n,
            categories={k: v / n for k, v in sorted(categories.items())},
            read_sites=_means(_sites(total, READ_CATEGORIES), n),
            collective_sites=_means(_sites(total, ('collective',)), n),
            reads_each=[_total(it, READ_CATEGORIES) for it in kept],
            collectives_each=[_total(it, ('collective',)) for it in kept],
        )


def _categories(kind: str) -> Tuple[str, ...]:
    if kind == 'reads':
        return READ_CATEGORIES
    if kind == 'collectives':
        return ('collective',)
    raise ValueError(f"kind must be 'reads' or 'collectives', not {kind!r}")


def _total(events: Counter, categories: Tuple[str, ...]) -> int:
    return sum(n for (cat, _), n in events.items() if cat in categories)


def _sites(events: Counter, categories: Tuple[str, ...]) -> Counter:
    sites: Counter = Counter()
    for (cat, site), n in events.items():
        if cat in categories:
            sites[site] += n
    return sites


def _means(sites: Counter, n: int) -> Dict[str, float]:
    return {site: count / n for site, count in sites.most_common()}


def _short_path(path: str) -> str:
    """``path`` relative to the repository or the ``site-packages`` that
    holds it (else to the longest ``sys.path`` entry): no machine path in
    a report, and the same name whichever script runs."""
    path = osp.abspath(path)
    roots = [osp.abspath(p or '.') for p in sys.path]
    packages = [r for r in roots if osp.basename(r) in _SITE_DIRS]
    for candidates in (packages + [_PACKAGE_ROOT], roots):
        best = ''
        for root in candidates:
            if path.startswith(root + os.sep) and len(root) > len(best):
                best = root
        if best:
            return osp.relpath(path, best).replace(os.sep, '/')
    return osp.basename(path)


class _Counter:
    """The state of one :func:`count_host_syncs` window."""

    def __init__(self, host_tensors: bool) -> None:
        self.host_tensors = host_tensors
        self.counts = SyncCounts()
        self.current: Optional[Counter] = None
        self.iter_depth = 0
        self.paths: Dict[str, str] = {}
        self.kinds: Dict[Any, str] = {}
        self.local = threading.local()

    # -- bookkeeping ------------------------------------------------------
    def suppressed(self) -> bool:
        return getattr(self.local, 'depth', 0) > 0

    @contextlib.contextmanager
    def suppress(self) -> Iterator[None]:
        self.local.depth = getattr(self.local, 'depth', 0) + 1
        try:
            yield
        finally:
            self.local.depth -= 1

    def site(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not (
                filename.startswith(_TORCH_DIR)
                or filename == _THIS_FILE
                or filename.startswith('<')
                or any(p in filename for p in _PASS_THROUGH)
            ):
                short = self.paths.get(filename)
                if short is None:
                    short = self.paths[filename] = _short_path(filename)
                return f'{short}:{frame.f_lineno}'
            frame = frame.f_back
        return '<torch>'

    def add(self, category: str) -> None:
        key = (category, self.site())
        self.counts.events[key] += 1
        if self.current is not None:
            self.current[key] += 1

    # -- what counts ------------------------------------------------------
    def classify(self, func, args, kwargs) -> Optional[str]:
        kind = self.kinds.get(func)
        if kind is None:
            kind = self.kinds[func] = _op_kind(func)
        if kind == '':
            return None
        if kind == 'mask':
            indices = args[1] if len(args) > 1 else kwargs.get('indices')
            masks = any(
                isinstance(i, torch.Tensor)
                and i.dtype in (torch.bool, torch.uint8)
                for i in indices or ()
            )
            return 'shape' if masks else None
        if kind == 'repeat':
            return 'shape' if kwargs.get('output_size') is None else None
        if kind == 'to_host':
            name = func._schema.name
            return 'copy' if _device_to_host(name, args, kwargs) else None
        return kind


def _op_kind(func) -> str:
    """What an operator is, once per operator: a category, ``'mask'``,
    ``'repeat'`` or ``'to_host'`` (decided by the arguments), or ``''``
    (never counted)."""
    name = func._schema.name
    if name in SCALAR_READ_OPS or name in BOOL_RESULT_OPS:
        return 'scalar'
    if name in DATA_DEPENDENT_OPS:
        return 'shape'
    if name in MASK_INDEX_OPS:
        return 'mask'
    if name == 'aten::repeat_interleave':
        return 'repeat' if func._overloadname == 'Tensor' else ''
    if name.startswith(COLLECTIVE_NAMESPACES):
        return '' if name in NOT_COLLECTIVES else 'collective'
    if name in ('aten::_to_copy', 'aten::copy_'):
        return 'to_host'
    return ''


def _device_to_host(name: str, args, kwargs) -> bool:
    """Whether a ``_to_copy`` / ``copy_`` moves an accelerator tensor to
    the CPU (never the case in a CPU-only run)."""
    if name == 'aten::copy_':
        dst, src = args[0], args[1]
        return src.device.type != 'cpu' and dst.device.type == 'cpu'
    src = args[0]
    device = kwargs.get('device')
    return (
        src.device.type != 'cpu'
        and device is not None
        and torch.device(device).type == 'cpu'
    )


class _CountingMode(TorchDispatchMode):
    def __init__(self, counter: _Counter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        counter = self.counter
        if not counter.suppressed():
            category = counter.classify(func, args, kwargs)
            if category is not None:
                counter.add(category)
        return func(*args, **kwargs)


def _patched_method(counter: _Counter, name: str, original):
    def host_copy(self, *args, **kwargs):
        if counter.suppressed():
            return original(self, *args, **kwargs)
        if counter.host_tensors or self.device.type != 'cpu':
            counter.add('copy')
        with counter.suppress():  # its own _to_copy is this copy
            return original(self, *args, **kwargs)

    host_copy.__name__ = name
    host_copy.__wrapped__ = original
    return host_copy


def _patched_run_iter(counter: _Counter, original):
    def run_iter(loop, *args, **kwargs):
        if counter.iter_depth:
            return original(loop, *args, **kwargs)
        counter.iter_depth += 1
        counter.current = Counter()
        counter.counts.iterations.append(counter.current)
        try:
            return original(loop, *args, **kwargs)
        finally:
            counter.iter_depth -= 1
            counter.current = None

    run_iter.__wrapped__ = original
    return run_iter


def _train_loop_classes() -> List[type]:
    try:
        from mmengine.runner.loops import (
            EpochBasedTrainLoop,
            IterBasedTrainLoop,
        )
    except ImportError:  # pragma: no cover - mmengine is a dependency
        return []
    return [EpochBasedTrainLoop, IterBasedTrainLoop]


@contextlib.contextmanager
def count_host_syncs(host_tensors: bool = True) -> Iterator[SyncCounts]:
    """Count host reads and collectives while the block runs.

    Args:
        host_tensors (bool): Count ``tolist``/``numpy``/``cpu`` of CPU
            tensors too (a CPU run, where every tensor stands for a device
            tensor). Pass False on a GPU to count only device tensors.
            Defaults to True.

    Yields:
        SyncCounts: Filled while the block runs (per iteration inside
        mmengine train loops).
    """
    counter = _Counter(host_tensors)
    # (owner, name, what its __dict__ held: None when it inherited it)
    saved: List[Tuple[Any, str, Any]] = []
    for name in HOST_COPY_METHODS:
        saved.append((torch.Tensor, name, torch.Tensor.__dict__.get(name)))
        original = getattr(torch.Tensor, name)
        setattr(torch.Tensor, name, _patched_method(counter, name, original))
    for cls in _train_loop_classes():
        saved.append((cls, 'run_iter', cls.__dict__.get('run_iter')))
        cls.run_iter = _patched_run_iter(counter, cls.run_iter)
    try:
        with _CountingMode(counter):
            yield counter.counts
    finally:
        for owner, name, original in reversed(saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
