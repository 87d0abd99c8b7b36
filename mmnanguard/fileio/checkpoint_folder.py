# Copyright (c) mmnanguard contributors. All rights reserved.
"""What a checkpoint folder holds.

``DeepSpeedStrategy`` (the model states and one optimizer partition per
rank) and ``FSDPStrategy`` with ``state_dict_cfg='local'`` (``rank<r>.pth``)
write a checkpoint as a folder named like a file, ``iter_<n>.pth``. Such a
folder holds nothing but regular files, each written by ``torch.save``.
:func:`checkpoint_parts` lists them, or says why the folder is not such a
checkpoint (empty, or holding a link or a folder: never followed);
:func:`~.checkpoint_verify.checkpoint_problem` then checks every part as
it checks a one-file checkpoint.
"""

import os
import os.path as osp
import stat
from typing import List, Optional, Tuple


def checkpoint_parts(path: str) -> Tuple[Optional[str], List[str]]:
    """The parts of the checkpoint folder ``path``.

    Args:
        path (str): A folder ``iter_<n>.pth`` or ``epoch_<n>.pth``.

    Returns:
        tuple: ``(problem, parts)``: a phrase to follow the folder's name
        and ``[]``, or ``None`` and the paths of its regular files, sorted.
    """
    try:
        names = sorted(os.listdir(path))
    except OSError as err:
        return f'it cannot be listed: {type(err).__name__}: {err}', []
    if not names:
        return 'it is an empty folder', []
    parts = []
    for name in names:
        part = osp.join(path, name)
        try:
            mode = os.lstat(part).st_mode
        except OSError as err:
            return f'its entry {name!r} cannot be read: {err}', []
        if not stat.S_ISREG(mode):
            return (
                f'its entry {name!r} is not a regular file (a checkpoint '
                "folder holds only the ranks' files)"
            ), []
        parts.append(part)
    return None, parts


__all__ = ['checkpoint_parts']
