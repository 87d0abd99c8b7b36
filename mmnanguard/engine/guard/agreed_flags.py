# Copyright (c) mmnanguard contributors. All rights reserved.
"""The named layout of the flags the ranks sum in the guard's one
``all_reduce``.

:meth:`StepGuard.read` sends, in this order, one flag per
:data:`AgreedFlags` field, then one flag per registered vote, then (for
sharded gradients) this rank's share of the gradient norm. After the sum a
flag above zero means "some rank saw it". :meth:`AgreedFlags.view` reads
the summed vector back by name, never by position.
"""

from typing import Generic, List, Sequence, TypeVar, Union, overload

from torch import Tensor

# a generic NamedTuple before Python 3.11 (typing_extensions: torch's)
from typing_extensions import NamedTuple

#: A flag: an element of the summed tensor, or a float of the host list.
T = TypeVar('T', covariant=True)


class AgreedFlags(NamedTuple, Generic[T]):
    """The fixed head of the summed vector: how many ranks saw each
    problem.

    Args:
        loss (T): A non-finite loss term or total loss.
        grad (T): A non-finite gradient norm (this rank's shards when the
            norm is folded).
        params (T): Non-finite parameters or buffers after the previous
            step (0 when no check was pending).
        buffers (T): Non-finite buffers after the forward (BatchNorm
            statistics; 0 for a model without floating buffers).
        spike (T): A loss or gradient-norm spike.
        amp_inf (T): The GradScaler's ``found_inf`` (0 without AMP).
    """

    loss: T
    grad: T
    params: T
    buffers: T
    spike: T
    amp_inf: T

    @overload
    @classmethod
    def view(cls, summed: Tensor) -> 'AgreedFlags[Tensor]': ...

    @overload
    @classmethod
    def view(cls, summed: Sequence[float]) -> 'AgreedFlags[float]': ...

    @classmethod
    def view(
        cls, summed: Union[Tensor, Sequence[float]]
    ) -> 'AgreedFlags[Union[Tensor, float]]':
        """The head of ``summed`` (a tensor or a list), by name."""
        return AgreedFlags(*summed[: len(cls._fields)])

    @overload
    @classmethod
    def votes(cls, summed: Tensor, count: int) -> Tensor: ...

    @overload
    @classmethod
    def votes(cls, summed: Sequence[float], count: int) -> Sequence[float]: ...

    @classmethod
    def votes(
        cls, summed: Union[Tensor, Sequence[float]], count: int
    ) -> Union[Tensor, Sequence[float]]:
        """The ``count`` vote flags after the head."""
        start = len(cls._fields)
        return summed[start : start + count]

    @overload
    @classmethod
    def tail(cls, summed: Tensor, count: int) -> Tensor: ...

    @overload
    @classmethod
    def tail(cls, summed: Sequence[float], count: int) -> Sequence[float]: ...

    @classmethod
    def tail(
        cls, summed: Union[Tensor, Sequence[float]], count: int
    ) -> Union[Tensor, Sequence[float]]:
        """What follows the head and ``count`` votes (the folded norm's
        share)."""
        return summed[len(cls._fields) + count :]

    def to_list(self) -> List[T]:
        """The fields in the order sent."""
        return list(self)
