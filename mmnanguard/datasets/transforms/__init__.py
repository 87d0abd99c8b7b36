# Copyright (c) mmnanguard contributors. All rights reserved.
from .validate_annotations import (
    InvalidAnnotationError,
    ValidateAnnotations,
    check_results,
)

__all__ = ['ValidateAnnotations', 'InvalidAnnotationError', 'check_results']
