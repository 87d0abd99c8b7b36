# Copyright (c) mmnanguard contributors. All rights reserved.
"""The printed table of the loss battery."""

from typing import List, Optional, Sequence

from .module_check import ModuleReport
from .runner import CaseResult


def format_number(value: Optional[float]) -> str:
    """``value`` in 4 significant digits; '-' for None."""
    return '-' if value is None else f'{value:.4g}'


def _verdict(result: CaseResult) -> str:
    """The verdict, with its message where there is one."""
    if result.message and result.verdict != 'finite':
        return f'{result.verdict}: {result.message}'
    return result.verdict


def format_table(
    reports: Sequence[ModuleReport], failures_only: bool = False
) -> str:
    """One row per module and case, then the drop-ins' results.

    Args:
        reports (Sequence[ModuleReport]): The battery's reports.
        failures_only (bool): Print only failing cases. Defaults to False.

    Returns:
        str: The table and a summary line.
    """
    header = ('module', 'type', 'case', 'value', 'grad', 'verdict')
    rows: List[tuple] = []
    notes: List[str] = []
    for report in reports:
        if report.error:
            rows.append(
                (
                    report.path,
                    report.loss_type,
                    '-',
                    '-',
                    '-',
                    f'error: {report.error}',
                )
            )
            continue
        if report.skipped:
            rows.append(
                (report.path, report.loss_type, '-', '-', '-', report.skipped)
            )
            continue
        if report.exercised:
            notes.append(
                f'{report.path} ({report.loss_type}): the cases ran on the '
                f'loss it holds, {report.exercised}'
            )
        for r in report.results:
            if failures_only and r.passed:
                continue
            rows.append(
                (
                    r.path,
                    r.loss_type,
                    r.case,
                    format_number(r.value),
                    format_number(r.grad),
                    _verdict(r),
                )
            )
        if report.drop_in:
            fixed = sum(r.passed for r in report.drop_in_results)
            notes.append(
                f'{report.path} ({report.loss_type}): safe drop-in '
                f"type='{report.drop_in}' passes {fixed} of "
                f'{len(report.drop_in_results)} failing cases:'
            )
            notes += [
                f'    {r.case}: {_verdict(r)} (value '
                f'{format_number(r.value)}, grad {format_number(r.grad)})'
                for r in report.drop_in_results
            ]
    widths = [
        min(48, max(len(str(row[i])) for row in rows + [header]))
        for i in range(len(header) - 1)
    ]
    lines = [
        '  '.join(str(c)[:48].ljust(w) for c, w in zip(row[:-1], widths))
        + '  '
        + str(row[-1])
        for row in [header] + rows
    ]
    failed = sum(len(r.failures) + bool(r.error) for r in reports)
    total = sum(len(r.results) for r in reports)
    lines.append('')
    lines += notes
    skipped = sum(bool(r.skipped) for r in reports)
    lines.append(
        f'{len(reports)} loss modules, {total} cases, {failed} failing'
        + (f', {skipped} not exercised' if skipped else '')
    )
    return '\n'.join(lines)
