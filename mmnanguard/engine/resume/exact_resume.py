# Copyright (c) mmnanguard contributors. All rights reserved.
"""A resume that continues the interrupted run, batch for batch and draw
for draw.

Each checkpoint of a protected run holds, under ``nanguard_resume``:

* ``rng``: the python, numpy, torch (and CUDA) generators of the saving
  process at the moment of the save (:mod:`.rng_record`);
* ``rng_of_ranks`` (under ``torch.distributed``): every rank's generators,
  in rank order, gathered on every rank before the master-only write
  (:meth:`ExactResume.gather_generators`);
* ``epoch`` and ``trained_in_epoch``: how many batches of the unfinished
  epoch were trained (0 for a save at the end of an epoch).

On resume (:meth:`ExactResume.load`, then :meth:`ExactResume.before_train`)
the loop continues at the next batch without loading the trained ones
(:mod:`.resume_position`), and the generators are restored at the point
where the interrupted run saved them: before the next batch is fetched
(mid-epoch, iteration-based) or before the next epoch's loader iterator is
made (at an epoch's end).

Validation runs between a save and the next batch (``val_interval``), and
it draws from the same generators (its loader's seed, random test-time
transforms). A protected run therefore restores the generators after each
validation to what they were before it (:meth:`before_val`,
:meth:`after_val`): the training draws do not depend on whether, or how
often, the run validated. With the per-batch seeds, these are the
differences from bare mmengine's streams.

The augmentations do not depend on any of this: each batch seeds the
generators of the process that loads it (:mod:`.batch_seeds`), so a
resume draws them again with any ``num_workers``.

What is not restored, and said in the log: the main-process generators of
ranks other than 0 when the checkpoint was saved by another number of
ranks, or without the gather (every rank takes rank 0's: their draws
inside the model differ after a resume), and the position of a loop that
overrides mmengine's ``run`` or ``run_epoch`` (resumed as it resumes, its
batches not seeded).
"""

from dataclasses import dataclass
from numbers import Integral
from typing import Any, Callable, Dict, List, Optional, Tuple

from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader

from ..guard.rng import capture_rng_state, restore_rng_state
from .resume_position import (
    ResumedIterator,
    resumed_run_epoch,
    seeded_batch_sampler,
)
from .rng_record import rng_record, rng_state_from_record

#: The checkpoint key of the record.
KEY = 'nanguard_resume'


@dataclass
class ResumePoint:
    """What a checkpoint's record says, checked.

    Args:
        trained_in_epoch (int): Batches of the unfinished epoch trained.
        rng (dict, optional): The generators' state; None: not restored.
        own_rng (bool): Whether every rank takes its own generators
            (False: every rank takes rank 0's).
    """

    trained_in_epoch: int
    rng: Optional[Dict[str, Any]]
    own_rng: bool = True


#: What a resume that cannot be exact does.
RESUME_AS_MMENGINE = (
    'a resume continues as mmengine resumes (the first batch of the '
    'epoch; iteration-based: the trained batches loaded again)'
)


def _restorer(rng: Optional[Dict[str, Any]]) -> Callable[[], None]:
    """A function that restores ``rng`` (None: does nothing)."""

    def restore() -> None:
        if rng is not None:
            restore_rng_state(rng)

    return restore


def _trained_in_epoch(record: Any, meta: dict) -> Optional[int]:
    """The record's ``trained_in_epoch`` if it is an int >= 0 and its
    ``epoch`` is the checkpoint's, else None."""
    if not isinstance(record, dict):
        return None
    trained = record.get('trained_in_epoch')
    if not isinstance(trained, Integral) or isinstance(trained, bool):
        return None
    if int(trained) < 0 or record.get('epoch') != meta.get('epoch'):
        return None
    return int(trained)


class ExactResume:
    """Record the position and the generators with each checkpoint, and
    continue from them on resume (see the module docstring)."""

    def __init__(self) -> None:
        self._trained_in_epoch = 0
        self._point: Optional[ResumePoint] = None
        self._before_val: Optional[Dict[str, Any]] = None
        self._of_ranks: Optional[List[Dict[str, Any]]] = None

    # -- the run being saved -------------------------------------------------
    def epoch_started(self) -> None:
        """A new epoch: no batch of it trained yet."""
        self._trained_in_epoch = 0

    def iteration_done(self, batch_idx: int) -> None:
        """Batch ``batch_idx`` of the epoch was trained."""
        self._trained_in_epoch = batch_idx + 1

    def gather_generators(self) -> None:
        """Under ``torch.distributed``, on every rank before the
        master-only part of a save: collect every rank's generators for
        the record (one ``all_gather_object`` per save)."""
        if get_world_size() > 1:
            self._of_ranks = all_gather_object(rng_record(capture_rng_state()))

    def record(self, runner: Any, checkpoint: dict) -> None:
        """Put the record into ``checkpoint`` (before it is written)."""
        meta = checkpoint.get('meta') or {}
        epoch = meta.get('epoch', runner.epoch)
        at_epoch_end = epoch == runner.epoch + 1
        record = dict(
            epoch=epoch,
            trained_in_epoch=0 if at_epoch_end else self._trained_in_epoch,
            rng=rng_record(capture_rng_state()),
        )
        of_ranks, self._of_ranks = self._of_ranks, None
        if of_ranks is not None:
            record['rng_of_ranks'] = of_ranks
        checkpoint[KEY] = record

    def before_val(self) -> None:
        """Keep the generators before a validation."""
        self._before_val = capture_rng_state()

    def after_val(self) -> None:
        """Give the generators back what they were before the validation."""
        if self._before_val is not None:
            restore_rng_state(self._before_val)
            self._before_val = None

    # -- the resumed run ---------------------------------------------------
    def load(self, runner: Any, checkpoint: dict) -> None:
        """Check the record of the checkpoint being resumed."""
        self._point = None
        meta = checkpoint.get('meta') or {}
        iteration = meta.get('iter')
        where = f'the checkpoint of iteration {iteration}'
        record = checkpoint.get(KEY)
        if record is None:
            runner.logger.info(
                f'nanguard: {where} holds no {KEY!r} (saved by bare '
                'mmengine or an earlier mmnanguard): it resumes as mmengine '
                'does, at the first batch of its epoch, with fresh random '
                'streams'
            )
            return
        trained = _trained_in_epoch(record, meta)
        if trained is None:
            runner.logger.warning(
                f"nanguard: {where}: {KEY!r} is not a record of this "
                f'checkpoint (expected trained_in_epoch >= 0 and epoch = '
                f"meta's {meta.get('epoch')!r}); it resumes as mmengine "
                'does, at the first batch of its epoch'
            )
            return
        saved, own = self._saved_generators(runner, where, record)
        rng, problems = rng_state_from_record(saved)
        for problem in problems:
            runner.logger.warning(
                f'nanguard: {where}: {KEY}.rng unusable ({problem}); '
                + (
                    'the other generators are restored'
                    if rng is not None
                    else 'the random generators are not restored: the '
                    'draws inside the model (dropout) after the resume '
                    "differ from the interrupted run's"
                )
            )
        self._point = ResumePoint(trained, rng, own)

    @staticmethod
    def _saved_generators(
        runner: Any, where: str, record: dict
    ) -> Tuple[Any, bool]:
        """This rank's generators in ``record`` (rank 0's where the record
        does not hold every rank's), and whether every rank takes its own."""
        world, rank = get_world_size(), get_rank()
        of_ranks = record.get('rng_of_ranks')
        if world == 1:
            return record.get('rng'), True
        if isinstance(of_ranks, list) and len(of_ranks) == world:
            return of_ranks[rank], True
        saved = (
            f'{len(of_ranks)} ranks'
            if isinstance(of_ranks, list)
            else 'rank 0 alone'
        )
        runner.logger.warning(
            f'nanguard: {where} holds the generators of {saved}; '
            f"{world} ranks resume it and every rank takes rank 0's: the "
            'draws inside the model (dropout) of ranks > 0 differ from the '
            "interrupted run's (the augmentations are seeded per batch and "
            'rank, and do not)'
        )
        return record.get('rng'), False

    def before_train(self, runner: Any) -> None:
        """Number and seed the batches (:mod:`.batch_seeds`); in a resumed
        run, continue the loop at the checkpoint's position."""
        point, self._point = self._point, None
        loop = runner.train_loop
        iter_based = isinstance(loop, IterBasedTrainLoop) and (
            type(loop).run is IterBasedTrainLoop.run
        )
        epoch_based = isinstance(loop, EpochBasedTrainLoop) and (
            type(loop).run_epoch is EpochBasedTrainLoop.run_epoch
        )
        if not (iter_based or epoch_based):
            runner.logger.warning(
                f"nanguard: {type(loop).__name__} overrides mmengine's "
                'run/run_epoch: its batches are not seeded, and a resume '
                'continues as that loop does'
            )
            return
        problem = self._seed_batches(runner, loop)
        if problem:
            runner.logger.warning(f'nanguard: {problem}; {RESUME_AS_MMENGINE}')
            return
        if loop.iter == 0:  # a fresh run, or a checkpoint of iteration 0
            point = None
        restore = _restorer(point.rng if point else None)
        if iter_based:
            trained = loop.iter if point else 0
            # onedl-mmengine's loop does not advance at all with
            # fast_forward_on_resume=True; the sampler is advanced anyway
            advances = not getattr(loop, 'fast_forward_on_resume', False)
            loop.dataloader_iterator = ResumedIterator(
                loop.dataloader,
                trained if advances else 0,
                restore,
                trained,
            )
            where = f'batch {loop.iter + 1} of the sampler'
        elif point and point.trained_in_epoch:
            self._resume_epoch(loop, point.trained_in_epoch, restore)
            where = (
                f'batch {point.trained_in_epoch + 1} of epoch {loop.epoch + 1}'
            )
        else:
            restore()
            where = f'the first batch of epoch {loop.epoch + 1}'
        if point:
            self._say_resumed(runner, loop, where, point)

    def _seed_batches(self, runner: Any, loop: Any) -> Optional[str]:
        """Put a :class:`SeededBatchSampler` into the loop's loader."""
        loader = loop.dataloader
        if not isinstance(loader, DataLoader):
            return f'the train loader is a {type(loader).__name__}'
        try:
            sampler = seeded_batch_sampler(loader)
        except ValueError as error:
            return str(error)
        sampler.number_from(runner.seed, get_rank(), loop.iter)
        runner.logger.info(
            'nanguard: each batch seeds the random generators of the process '
            f'that loads it (run seed {runner.seed}, rank, batch number): a '
            'resume draws the augmentations of the interrupted run, with any '
            'num_workers'
        )
        return None

    def _resume_epoch(self, loop: Any, trained: int, restore: Any) -> None:
        """Run the interrupted epoch from batch ``trained`` once."""

        def run_epoch() -> None:
            del loop.run_epoch  # the class's own from the next epoch on
            resumed_run_epoch(loop, trained, restore)

        loop.run_epoch = run_epoch

    def _say_resumed(
        self, runner: Any, loop: Any, where: str, point: ResumePoint
    ) -> None:
        streams = (
            'random generators restored'
            if point.rng is not None
            else 'random generators NOT restored'
        )
        if point.rng is not None and get_world_size() > 1:
            streams += ', each rank its own' if point.own_rng else ", rank 0's"
        runner.logger.info(
            f'nanguard: resumed at iteration {loop.iter}: continues at '
            f'{where} without loading the trained batches; {streams}'
        )


__all__ = ['KEY', 'ExactResume', 'ResumePoint']
