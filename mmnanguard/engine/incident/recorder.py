# Copyright (c) mmnanguard contributors. All rights reserved.
"""Write incident folders during training, and mark those a resume discarded.

* An incident folder is built under a temporary name
  (``.tmp_incident_<random>``) in ``nanguard/``, every file written into
  it (:mod:`.safe_write`): ``batch.pth``, then what the ``fill`` callback
  adds (the diagnosis' files), then ``report.json``, once and complete;
  only then is it renamed to its final name. The rename never replaces
  anything: when the name exists the next number is taken. A kill (during
  the diagnosis too) leaves either no incident folder or a complete one
  (and perhaps a ``.tmp_incident_*`` folder, which no reader takes for an
  incident).
* Incidents are numbered from what is on disk: one more than the highest
  ``incident_NNN_*`` in ``nanguard/``, whichever rank wrote it (a rank
  whose peer already wrote the same iteration's incident joins its
  number).
* A failed write never stops training: it is logged and the incident has
  no folder.
"""

import errno
import logging
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from mmengine.logging import print_log

from .allowlist import replay_refusal
from .loading import load_report
from .names import (
    BATCH_NAME,
    DISCARDED_NAME,
    REPORT_NAME,
    parse_folder_name,
)
from .safe_write import (
    DIR_FLAGS,
    json_bytes,
    make_temp_dir,
    open_folder,
    remove_temp_dir,
    rename_noreplace,
    write_at,
)

#: ``fill(files_folder, folder) -> report``: see
#: :meth:`IncidentRecorder.record`.
Fill = Callable[[str, str], Dict[str, Any]]


class IncidentRecorder:
    """Writes one folder per incident: ``report.json`` and ``batch.pth``.

    Folder names are ``incident_{n:03d}_iter{iteration:06d}`` (with
    ``_rank{r}`` under DDP, where every rank writes its own), ``n``
    numbered from the folders on disk. See the module docstring for how
    a folder is built, named and renamed into place.

    Args:
        work_dir (str): The runner's work dir; folders go to
            ``{work_dir}/nanguard``.
        max_incidents (int): Folders this rank writes at most (its
            folders already on disk count).
        rank (int): This process' rank.
        world_size (int): Number of processes.
    """

    def __init__(
        self, work_dir: str, max_incidents: int, rank: int, world_size: int
    ) -> None:
        self.root = osp.join(work_dir, 'nanguard')
        self.max_incidents = max_incidents
        self.rank = rank
        self.world_size = world_size
        self.written = len(self.own_folders())

    def _suffix_rank(self) -> Optional[int]:
        return self.rank if self.world_size > 1 else None

    def _parsed(self) -> List[Tuple[int, int, Optional[int]]]:
        try:
            names = os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [p for p in map(parse_folder_name, names) if p is not None]

    def own_folders(self) -> List[str]:
        """The incident folders of this rank in :attr:`root`, by name."""
        mine = self._suffix_rank()
        return sorted(
            self.folder_name(n, it)
            for n, it, rank in self._parsed()
            if rank == mine
        )

    def folder_name(self, number: int, iteration: int) -> str:
        """``incident_{number:03d}_iter{iteration:06d}[_rank{r}]``."""
        name = f'incident_{number:03d}_iter{iteration:06d}'
        if self.world_size > 1:
            name += f'_rank{self.rank}'
        return name

    def next_number(self, iteration: int) -> int:
        """The number of this rank's next incident at ``iteration``.

        One more than the highest number on disk (0 on an empty disk),
        except that a peer rank's folder of the same iteration, numbered
        above every folder of this rank, gives its number: the ranks'
        folders of one incident share it.
        """
        parsed = self._parsed()
        mine = self._suffix_rank()
        top_mine = max((n for n, _, r in parsed if r == mine), default=-1)
        peers = sorted(
            n
            for n, it, r in parsed
            if it == iteration and r != mine and n > top_mine
        )
        if peers:
            return peers[0]
        return max((n for n, _, _ in parsed), default=-1) + 1

    def record(
        self,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]] = None,
        *,
        force: bool = False,
        fill: Optional[Fill] = None,
    ) -> Optional[str]:
        """Write the incident; return its folder, or None.

        Never raises into training: a failure to write (a full disk, a
        batch ``torch.save`` cannot pickle, a link where the folder should
        be) is logged as an error naming the folder and the error, the
        temporary folder is removed, ``report['write_error']`` says why,
        and None is returned.

        Args:
            report (dict): JSON-serializable report with an integer
                ``iteration``; ``report_path`` is set to the final
                ``report.json`` (removed again when nothing was written).
            batch (dict, optional): Written to ``batch.pth`` when given
                (the data batch and the RNG states).
            force (bool): Write even when ``max_incidents`` folders exist
                (the incident that stops training). Defaults to False.
            fill (Callable, optional): Called as ``fill(files_folder,
                folder)`` after ``batch.pth`` and before ``report.json``:
                ``files_folder`` is the temporary folder, to write more
                files into, and ``folder`` the final one it becomes. It
                returns the report to write (``report`` completed, a
                dict). An exception it raises is logged and ``report`` is
                written as given. Not called when nothing is written.

        Returns:
            str | None: The folder; None when ``max_incidents`` folders
            exist already (and not ``force``) or the write failed.
        """
        iteration = report['iteration']
        if self.written >= self.max_incidents and not force:
            print_log(
                f'nanguard: the incident of iteration {iteration} is not '
                f'written: max_incidents={self.max_incidents} folders of '
                f'this rank exist in {self.root}',
                logger='current',
                level=logging.WARNING,
            )
            return None
        target = [osp.join(self.root, self.folder_name(0, iteration))]
        try:
            folder = self._write(report, batch, target, fill)
        except Exception as err:  # noqa: BLE001  (logged; never stops a run)
            message = (
                f'nanguard: could not write the incident folder '
                f'{target[0]}: {type(err).__name__}: {err}. Training goes '
                'on; this incident has no folder.'
            )
            report.pop('report_path', None)
            report['write_error'] = message
            print_log(message, logger='current', level=logging.ERROR)
            return None
        self.written += 1
        if batch is not None:
            _warn_if_refused(osp.join(folder, BATCH_NAME))
        return folder

    def _write(
        self,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]],
        target: List[str],
        fill: Optional[Fill] = None,
    ) -> str:
        """Build the folder under a temporary name, rename it into place.

        ``target[0]`` is kept up to date with the folder being written,
        for the error message.
        """
        os.makedirs(self.root, exist_ok=True)
        root_fd = open_folder(self.root)
        try:
            tmp = make_temp_dir(root_fd)
            target[0] = osp.join(self.root, tmp)
            try:
                name = self._fill_and_rename(root_fd, tmp, report, batch, fill)
            except BaseException:
                remove_temp_dir(root_fd, tmp)
                raise
            os.fsync(root_fd)
        finally:
            os.close(root_fd)
        return osp.join(self.root, name)

    def _fill_and_rename(
        self,
        root_fd: int,
        tmp: str,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]],
        fill: Optional[Fill] = None,
    ) -> str:
        iteration = report['iteration']
        dir_fd = os.open(tmp, DIR_FLAGS, dir_fd=root_fd)
        try:
            if batch is not None:
                write_at(dir_fd, BATCH_NAME, lambda f: torch.save(batch, f))
            number = self.next_number(iteration)
            written = report
            if fill is not None:
                written = _filled(
                    fill,
                    report,
                    osp.join(self.root, tmp),
                    osp.join(self.root, self.folder_name(number, iteration)),
                )
            for _ in range(1000):
                name = self.folder_name(number, iteration)
                path = osp.join(self.root, name, REPORT_NAME)
                report['report_path'] = written['report_path'] = path
                write_at(dir_fd, REPORT_NAME, json_bytes(written))
                os.fsync(dir_fd)
                if rename_noreplace(root_fd, tmp, name):
                    return name
                number = max(number + 1, self.next_number(iteration))
        finally:
            os.close(dir_fd)
        raise FileExistsError(
            errno.EEXIST,
            'no free incident folder name after 1000 tries',
            self.root,
        )


def _filled(
    fill: Fill, report: Dict[str, Any], files_folder: str, folder: str
) -> Dict[str, Any]:
    """The report ``fill`` completes; ``report`` itself when it fails."""
    try:
        return fill(files_folder, folder)
    except Exception as err:  # noqa: BLE001  (logged; the record is kept)
        print_log(
            f'nanguard: completing the incident report of {folder} failed '
            f'({type(err).__name__}: {err}); it is written as recorded',
            logger='current',
            level=logging.ERROR,
        )
        return report


def _warn_if_refused(batch_path: str) -> None:
    refusal = replay_refusal(batch_path)
    if refusal is not None:
        print_log(
            'nanguard: offline replay (tools/replay.py, load_incident) '
            f'will refuse this incident batch. {refusal}',
            logger='current',
            level=logging.WARNING,
        )


def mark_discarded(root: str, after_iteration: int) -> List[str]:
    """Mark the incident folders that a resume discarded.

    A run resumed from a checkpoint repeats (or never reaches again) the
    iterations after it: their incidents describe a part of the run that
    no longer exists. Each such folder gets a ``DISCARDED`` file and
    ``"discarded_by_resume": true`` (with ``resumed_at_iteration``) in its
    ``report.json``. No link is followed on the way: ``root`` and each
    folder are opened with ``O_NOFOLLOW`` (:func:`~.safe_write.open_folder`,
    then relative to its descriptor), ``report.json`` is read relative to
    the folder's descriptor, and both files are written with
    :func:`~.safe_write.write_at`. A ``root`` that is a link is refused
    (logged; nothing is marked); folders that are links, and folders
    already marked, are left alone; a folder whose ``report.json`` cannot
    be read or written still gets the ``DISCARDED`` file (the failure is
    logged).

    Args:
        root (str): ``{work_dir}/nanguard``.
        after_iteration (int): The iterations the checkpoint completed
            (``checkpoint['meta']['iter']``, the ``runner.iter`` the
            resumed run starts at). An incident whose 0-based
            ``iteration`` is this or later happened after the checkpoint.

    Returns:
        list[str]: The folders marked now, sorted.
    """
    try:
        root_fd = open_folder(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except (OSError, ValueError) as err:  # a link: UnsafeIncidentFolderError
        print_log(
            f'nanguard: the incident folders of {root} are not marked as '
            f'discarded by the resume: {err}',
            logger='current',
            level=logging.ERROR,
        )
        return []
    marked = []
    try:
        for name in sorted(os.listdir(root_fd)):
            parsed = parse_folder_name(name)
            if parsed is None or parsed[1] < after_iteration:
                continue
            folder = osp.join(root, name)
            if _mark_one(root_fd, name, folder, after_iteration, parsed[1]):
                marked.append(folder)
    finally:
        os.close(root_fd)
    return marked


def _mark_one(
    root_fd: int, name: str, folder: str, after_iteration: int, iteration: int
) -> bool:
    """Mark one folder (see :func:`mark_discarded`); whether it was."""
    try:
        dir_fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
    except OSError:  # a link (ELOOP), not a folder, gone: left alone
        return False
    try:
        try:
            os.lstat(DISCARDED_NAME, dir_fd=dir_fd)
            return False  # marked already
        except FileNotFoundError:
            pass
        note = (
            f'The run was resumed from a checkpoint of iteration '
            f'{after_iteration}; this incident (iteration {iteration}) '
            'happened after it, in a part of the run the resume '
            'discarded.\n'
        )
        try:
            write_at(dir_fd, DISCARDED_NAME, note)
            os.fsync(dir_fd)
        except OSError as err:
            print_log(
                f'nanguard: could not mark {folder} as discarded by the '
                f'resume: {type(err).__name__}: {err}',
                logger='current',
                level=logging.ERROR,
            )
            return False
        try:
            report = load_report(folder, dir_fd=dir_fd)
            report['discarded_by_resume'] = True
            report['resumed_at_iteration'] = after_iteration
            write_at(dir_fd, REPORT_NAME, json_bytes(report))
            os.fsync(dir_fd)
        except (OSError, ValueError) as err:
            print_log(
                f'nanguard: {folder} is marked DISCARDED, but its '
                f'{REPORT_NAME} was not updated: {err}',
                logger='current',
                level=logging.WARNING,
            )
        return True
    finally:
        os.close(dir_fd)
