# Copyright (c) mmnanguard contributors. All rights reserved.
"""A finding of the config doctor."""

from dataclasses import asdict, dataclass
from typing import Any, Dict

#: Severities, most severe first.
SEVERITIES = ('error', 'warning', 'info')


@dataclass
class Finding:
    """A setting linked to NaNs, with a one-line fix in config syntax.

    Args:
        rule (str): The rule's name, e.g. ``'sgd-without-clip-grad'``.
        severity (str): One of :data:`SEVERITIES`.
        message (str): What was found, with the values.
        fix (str): The fix, in config syntax.
        path (str): Config path of the setting. Defaults to ''.
    """

    rule: str
    severity: str
    message: str
    fix: str
    path: str = ''

    def __post_init__(self) -> None:
        """Check the severity.

        Raises:
            ValueError: It is not one of :data:`SEVERITIES`.
        """
        if self.severity not in SEVERITIES:
            raise ValueError(
                f'Finding {self.rule!r}: severity must be one of '
                f'{SEVERITIES}, got {self.severity!r}'
            )

    def to_dict(self) -> Dict[str, Any]:
        """The finding as a JSON-ready dict."""
        return asdict(self)
