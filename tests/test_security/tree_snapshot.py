# Copyright (c) mmnanguard contributors. All rights reserved.
"""What a folder holds, to assert that nothing under it changed."""

import os
import os.path as osp
from typing import Dict, Tuple


def snapshot_tree(path: str) -> Dict[str, Tuple[str, object]]:
    """Every entry under ``path``: a file with its bytes, a link with its
    target (not followed); folders only through what they hold."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = osp.join(dirpath, name)
            if osp.islink(full):
                found[full] = ('link', os.readlink(full))
            elif osp.isfile(full):
                with open(full, 'rb') as f:
                    found[full] = ('file', f.read())
    return found
