# Copyright (c) mmnanguard contributors. All rights reserved.
"""Draw the fault matrix (``fault_matrix.py --out``) as a PNG: one panel
per config, faults x modes, cells coloured by outcome.

Usage::

    python benchmarks/plot_fault_matrix.py benchmarks/fault_matrix.json \
        benchmarks/fault_matrix.png
"""

import argparse
import json
import os.path as osp
import sys
from typing import Any, Dict, List

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, HERE)

from fault_matrix_cell import FAULTS, MODES, OUTCOMES  # noqa: E402

#: outcome -> (colour, legend label)
COLOURS = {
    'recovered': ('#2e7d32', 'detected, finite, completed, healthy'),
    'stalled': ('#4fc3f7', 'detected, finite, completed, still failing'),
    'stopped_clean': ('#81c784', 'detected, stopped cleanly, finite'),
    'detected_poisoned': ('#ffb74d', 'detected, weights/ckpt non-finite'),
    'silent_finite': ('#fff176', 'not detected, still finite'),
    'ruined': ('#e53935', 'not detected, weights/ckpt non-finite'),
    'crashed': ('#8e24aa', 'crashed (not a detection)'),
    'no_fault': ('#bdbdbd', 'fault filtered at loading'),
}
MODE_TITLES = dict(
    bare='bare\nmmengine',
    check_invalid_loss='CheckInvalid\n' 'LossHook(1)',
    anomaly='detect_\nanomaly',
    guard_raise='nanguard\nraise',
    guard_skip='nanguard\nskip',
    guard_rollback='nanguard\nrollback',
)
CONFIG_TITLES = dict(
    dota='mmrotate rotated RetinaNet, tiny DOTA',
    coco='mmdet RetinaNet, tiny COCO',
)


def cell_text(cell: Dict[str, Any]) -> str:
    """Three short lines: detection, finiteness, cause."""
    if cell.get('outcome') == 'crashed' and cell.get('wall_s') is None:
        return 'cell failed'
    if cell.get('outcome') == 'no_fault':
        line1 = 'filtered at loading'
    elif cell.get('detected'):
        delta = cell.get('detect_delta')
        line1 = 'caught' + (f' {delta:+d}' if delta is not None else '')
    else:
        line1 = 'not caught'
    marks = [
        ('W', cell.get('weights_finite')),
        ('C', cell.get('checkpoints_finite')),
        ('M', cell.get('reached_max_iters')),
    ]
    line2 = ' '.join(f"{k}{'+' if v else '-'}" for k, v in marks)
    if cell.get('cause_ok') is None:
        line3 = ''
    else:
        cause = str(cell.get('cause') or '')
        if 'fp16_overflow' in cause:
            cause = 'fp16 overflow'
        else:
            cause = cause.split(' ')[0].rstrip(',')
        line3 = f"{cause} {'ok' if cell['cause_ok'] else 'WRONG'}"
    return '\n'.join(x for x in (line1, line2, line3) if x)


def plot(cells: List[Dict[str, Any]], path: str) -> None:
    """Write the PNG."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    configs = [
        c for c in ('dota', 'coco') if any(x['config'] == c for x in cells)
    ]
    faults = [f for f in FAULTS if any(x['fault'] == f for x in cells)]
    modes = [m for m in MODES if any(x['mode'] == m for x in cells)]
    by_key = {(x['config'], x['fault'], x['mode']): x for x in cells}
    fig, axes = plt.subplots(
        1,
        len(configs),
        squeeze=False,
        figsize=(
            1.55 * len(modes) * len(configs) + 2.2,
            0.78 * len(faults) + 2.6,
        ),
    )
    for ax, config in zip(axes[0], configs):
        for i, fault in enumerate(faults):
            for j, mode in enumerate(modes):
                cell = by_key.get((config, fault, mode))
                if cell is None:
                    continue
                colour = COLOURS[cell['outcome']][0]
                ax.add_patch(
                    plt.Rectangle(
                        (j, i),
                        1,
                        1,
                        facecolor=colour,
                        edgecolor='white',
                        linewidth=2,
                    )
                )
                dark = cell['outcome'] in ('recovered', 'ruined', 'crashed')
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    cell_text(cell),
                    ha='center',
                    va='center',
                    fontsize=7.5,
                    color='white' if dark else 'black',
                )
        ax.set_xlim(0, len(modes))
        ax.set_ylim(len(faults), 0)
        ax.set_xticks([j + 0.5 for j in range(len(modes))])
        ax.set_xticklabels([MODE_TITLES[m] for m in modes], fontsize=8)
        ax.xaxis.tick_top()
        ax.set_yticks([i + 0.5 for i in range(len(faults))])
        ax.set_yticklabels([FAULTS[f]['label'] for f in faults], fontsize=8)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_title(CONFIG_TITLES[config], fontsize=10, pad=34)
    if len(configs) > 1:
        for ax in axes[0][1:]:
            ax.set_yticklabels([])
    used = [o for o in OUTCOMES if any(x['outcome'] == o for x in cells)]
    handles = [
        Patch(facecolor=COLOURS[o][0], label=COLOURS[o][1]) for o in used
    ]
    fig.legend(
        handles=handles,
        loc='lower center',
        ncol=min(4, len(used)),
        fontsize=8,
        frameon=False,
    )
    height = fig.get_size_inches()[1]
    legend_in = 0.22 * ((len(used) + 3) // 4) + 0.05
    fig.text(
        0.5,
        (legend_in + 0.05) / height,
        'caught +k: detected k iterations after the fault was planted.  '
        'W: weights finite, C: every checkpoint finite, M: reached '
        'max_iters (+ yes, - no).\nLast line: the cause named by the first '
        'incident report (nanguard modes only).',
        ha='center',
        va='bottom',
        fontsize=7.5,
    )
    fig.tight_layout(rect=(0, (legend_in + 0.45) / height, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('json', help='fault_matrix.py --out file')
    parser.add_argument('png', help='output PNG')
    args = parser.parse_args()
    with open(args.json) as f:
        cells = json.load(f)['cells']
    plot(cells, args.png)
    return 0


if __name__ == '__main__':
    sys.exit(main())
