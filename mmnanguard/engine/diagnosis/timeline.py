# Copyright (c) mmnanguard contributors. All rights reserved.
"""``timeline.png``: the buffered iterations before an incident."""

import math
import textwrap
from typing import Any, List, Optional

from ..incident import ReportData, write_incident_file

TIMELINE_PNG = 'timeline.png'


def _value(value: Any) -> Optional[float]:
    """A float, ``inf``/``nan`` for the strings the history keeps, or None."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _plot(
    ax, iters: List[int], values: List[Optional[float]], label: str, log: bool
) -> None:
    pts = [(i, v) for i, v in zip(iters, values) if v is not None]
    good = [(i, v) for i, v in pts if math.isfinite(v) and (v > 0 or not log)]
    bad = [i for i, v in pts if not math.isfinite(v)]
    if good:
        (line,) = ax.plot(*zip(*good), marker='o', ms=3, label=label)
        color = line.get_color()
    else:
        color = 'C3'
    for i in bad:  # a non-finite value: a cross on the top edge
        ax.plot(
            [i],
            [1.0],
            marker='X',
            ms=10,
            color=color,
            ls='',
            transform=ax.get_xaxis_transform(),
            clip_on=False,
        )
    if log and good:
        ax.set_yscale('log')


def write_timeline(report: ReportData, folder: str) -> str:
    """Plot loss terms, grad norm, lr and loss scale over ``history``, with
    the incident iteration marked; write ``timeline.png`` into ``folder``.

    Non-finite values are drawn as crosses on the top edge of their panel.

    Args:
        report (dict): The incident report (``history``, ``iteration``,
            ``diagnosis`` when present).
        folder (str): The incident folder.

    Returns:
        str: The path of the PNG.
    """
    # The Agg canvas directly: no pyplot, so the global backend and any
    # open figures of the user are left alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    history = report.get('history', [])
    iters = [h['iteration'] for h in history]
    terms = sorted({k for h in history for k in h.get('loss_terms', {})})
    fig = Figure(figsize=(9, 9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(4, 1, sharex=True)
    for term in terms:
        _plot(
            axes[0],
            iters,
            [_value(h['loss_terms'].get(term)) for h in history],
            term,
            log=True,
        )
    axes[0].set_ylabel('loss terms')
    if axes[0].get_legend_handles_labels()[0]:  # none before iteration 1
        axes[0].legend(fontsize=7, loc='upper left', ncol=3)
    panels = (
        ('grad_norm', 'grad norm', True),
        ('lr', 'learning rate', True),
        ('loss_scale', 'loss scale', True),
    )
    for ax, (key, label, log) in zip(axes[1:], panels):
        values = [_value(h.get(key)) for h in history]
        _plot(ax, iters, values, label, log)
        ax.set_ylabel(label)
        if all(v is None for v in values):
            ax.text(
                0.5,
                0.5,
                f'no {label} recorded (no AMP)'
                if key == 'loss_scale'
                else f'no {label} recorded',
                ha='center',
                va='center',
                transform=ax.transAxes,
                color='gray',
            )
    for ax in axes:
        ax.axvline(report['iteration'], color='red', ls='--', lw=1.5)
        ax.grid(alpha=0.3)
    axes[0].text(
        report['iteration'],
        1.02,
        'incident ',
        color='red',
        ha='right',
        transform=axes[0].get_xaxis_transform(),
    )
    axes[-1].set_xlabel('iteration')
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    title = f"nanguard: {report['kind']} at iteration {report['iteration']}"
    if report.get('cause'):
        title += f" -- cause: {report['cause']}"
    summary = (report.get('diagnosis') or {}).get('summary')
    if summary:
        title += '\n' + textwrap.shorten(summary, 300)
    title = '\n'.join(textwrap.fill(t, 100) for t in title.split('\n'))
    fig.suptitle(title + '\n(x = non-finite value)', fontsize=10)
    fig.tight_layout()
    return write_incident_file(
        folder, TIMELINE_PNG, lambda f: fig.savefig(f, format='png', dpi=90)
    )
