# Copyright (c) mmnanguard contributors. All rights reserved.
"""Write one folder per incident under ``{work_dir}/nanguard/``."""

import json
import logging
import os
import os.path as osp
from typing import Any, Dict, Optional

import torch
from mmengine.logging import print_log

REPORT_NAME = 'report.json'
BATCH_NAME = 'batch.pth'


class IncidentRecorder:
    """Writes ``report.json`` and ``batch.pth`` for each incident.

    Folder names are ``incident_{n:03d}_iter{iteration:06d}`` (with
    ``_rank{r}`` under DDP, where every rank writes its own). Files are
    written to a temporary name and renamed, so a reader never sees a
    half-written report.

    Args:
        work_dir (str): The runner's work dir.
        max_incidents (int): Folders written at most.
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
        self.written = 0

    def folder_for(self, index: int, iteration: int) -> str:
        """The folder of incident number ``index`` at ``iteration``."""
        name = f'incident_{index:03d}_iter{iteration:06d}'
        if self.world_size > 1:
            name += f'_rank{self.rank}'
        return osp.join(self.root, name)

    def record(
        self,
        index: int,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]] = None,
    ) -> Optional[str]:
        """Write the incident; return its folder, or None past the bound.

        Args:
            index (int): The incident's number in this run (0-based).
            report (dict): JSON-serializable report; ``report_path`` is
                added.
            batch (dict, optional): Written to ``batch.pth`` when given
                (the data batch and the RNG states).

        Returns:
            str | None: The folder, or None when ``max_incidents`` folders
            exist already.
        """
        if self.written >= self.max_incidents:
            print_log(
                f'nanguard: incident {index} not written: max_incidents='
                f'{self.max_incidents} folders exist in {self.root}',
                logger='current',
            )
            return None
        folder = self.folder_for(index, report['iteration'])
        os.makedirs(folder, exist_ok=True)
        report['report_path'] = osp.join(folder, REPORT_NAME)
        if batch is not None:
            batch_path = osp.join(folder, BATCH_NAME)
            _atomic_torch_save(batch, batch_path)
            _warn_if_refused(batch_path)
        tmp = osp.join(folder, REPORT_NAME + '.tmp')
        with open(tmp, 'w') as f:
            json.dump(report, f, indent=2, default=str)
        os.replace(tmp, osp.join(folder, REPORT_NAME))
        self.written += 1
        return folder


def _atomic_torch_save(obj: Any, path: str) -> None:
    tmp = path + '.tmp'
    torch.save(obj, tmp)
    os.replace(tmp, path)


def replay_refusal(batch_path: str) -> Optional[str]:
    """Why offline replay would refuse ``batch_path``, or None.

    ``batch.pth`` is read back with ``weights_only=True`` and an allowlist
    of data classes; a batch holding anything else (say, a custom object
    in a dataset's metainfo) is refused. This says so when the file is
    written, not when someone replays it.

    Args:
        batch_path (str): A ``batch.pth`` just written.

    Returns:
        str | None: The refusal, naming the file and the globals outside
        the allowlist; None when replay will load the file.
    """
    from ..diagnosis.incident_files import (
        UntrustedIncidentError,
        check_batch_globals,
    )

    try:
        check_batch_globals(batch_path)
    except UntrustedIncidentError as err:
        return str(err)
    return None


def _warn_if_refused(batch_path: str) -> None:
    refusal = replay_refusal(batch_path)
    if refusal is not None:
        print_log(
            'nanguard: offline replay (tools/replay.py, load_incident) '
            f'will refuse this incident batch. {refusal}',
            logger='current',
            level=logging.WARNING,
        )


def load_report(folder: str) -> Dict[str, Any]:
    """Read ``report.json`` of an incident folder."""
    with open(osp.join(folder, REPORT_NAME)) as f:
        return json.load(f)
