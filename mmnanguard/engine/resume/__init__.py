# Copyright (c) mmnanguard contributors. All rights reserved.
"""An exact resume: position and random generators of the interrupted run
(:mod:`.exact_resume`)."""

from .exact_resume import KEY, ExactResume, ResumePoint

__all__ = ['KEY', 'ExactResume', 'ResumePoint']
