# Copyright (c) mmnanguard contributors. All rights reserved.
"""The errors that stop a protected resume before anything is trained.

``tools/train.py`` exits 2 on each, with its message as one paragraph.
"""


class UnusableCheckpointError(RuntimeError):
    """The checkpoint named for resuming does not load and neither does
    any other next to it or in the work dir, or a ``load_from`` file is
    cut short. ``tools/train.py`` exits 2 on it (nothing was trained)."""


class CheckpointValueError(UnusableCheckpointError):
    """A value that a resume reads from a file is not of the form mmengine
    or mmnanguard writes: ``meta.iter`` a string, a NaN in the guard's
    state, ``last_checkpoint`` holding a NUL byte or not UTF-8 text. The
    message names the file, the key and the expected form; nothing was
    trained."""


__all__ = ['CheckpointValueError', 'UnusableCheckpointError']
