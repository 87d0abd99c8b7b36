# Copyright (c) mmnanguard contributors. All rights reserved.
"""Markdown tables of the zoo sweep and the static pass (``zoo.py
markdown``), for the "Zoo sweep" section of ``benchmarks/RESULTS.md``."""

import collections
import re
from typing import Any, Dict, List, Optional

from zoo_static import STATUSES

#: Sweep outcome -> label in the tables.
OUTCOMES = dict(
    pass_='pass',
    fail='FAIL: a check failed',
    nanguard='FAIL: error with the include only',
    cpu_kernel='cannot run on CPU: no CPU kernel',
    cuda_only='cannot run on CPU: CUDA-only code',
    missing_dependency='needs a package outside the pinned stack',
    download='needs a download',
    no_data='needs data the generators cannot produce',
    no_model='not a model config (a base of settings)',
    upstream='fails without the include too',
    timeout='timeout',
)


#: Sweep outcome -> column of the summary table.
SHORT = dict(
    pass_='pass',
    fail='FAIL (check)',
    nanguard='FAIL (include only)',
    cpu_kernel='no CPU kernel',
    cuda_only='CUDA-only code',
    missing_dependency='missing package',
    download='download',
    no_data='no data',
    no_model='no model',
    upstream='upstream error',
    timeout='timeout',
)


def _yn(value: Optional[bool]) -> str:
    return '-' if value is None else ('yes' if value else 'NO')


def _short(text: Any, limit: int = 120) -> str:
    text = re.sub(r'\S*site-packages/', '', str(text or ''))
    text = text.replace('|', '/').replace('\n', ' ')
    return text if len(text) <= limit else text[: limit - 3] + '...'


def _note(cell: Dict[str, Any]) -> str:
    guard, bare = cell['guard'], cell.get('bare')
    outcome = cell['outcome']
    if outcome == 'pass_':
        return ''
    if outcome in ('no_data', 'no_model'):
        return _short(guard.get('reason'))
    if outcome == 'fail':
        failed = [k for k, v in guard.get('checks', {}).items() if not v]
        return 'failed: ' + ', '.join(failed)
    source = bare if outcome != 'nanguard' and bare else guard
    note = _short(source.get('detail'))
    imports = re.search(r"'imports': (\[[^\]]*\])", note)
    if imports:  # a failed custom_imports: name the modules only
        note = f'custom_imports {imports.group(1)}'
    if outcome in ('upstream', 'nanguard'):
        note = f'{note}: {_short(source.get("error"), 160)}'
    safe = cell.get('safe_modules')
    if safe is not None:
        note += f'; with safe_modules.py: **{safe["status"]}**'
        if safe['status'] == 'error':
            note += f' ({_short(safe.get("detail"), 60)})'
    return note


def _row(cell: Dict[str, Any]) -> List[str]:
    guard = cell['guard']
    trained = cell['outcome'] in ('pass_', 'fail')
    checks = (guard.get('checks') or {}) if trained else {}
    rel = cell['config'].partition('::')[2]
    finite = '-'
    if checks:
        finite = '/'.join(
            _yn(checks.get(k))
            for k in ('weights_finite', 'ema_finite', 'checkpoints_finite')
        )
        if guard.get('ema') is False:
            finite = finite.split('/')
            finite[1] = '-'
            finite = '/'.join(finite)
    return [
        cell['family'].partition('/')[2],
        f'`{rel.rpartition("/")[2]}`',
        cell['fault'],
        OUTCOMES[cell['outcome']],
        _yn(checks.get('incident_in_fault_iter')),
        _yn(checks.get('step_skipped')),
        finite,
        f"{guard.get('wall_s', '-')}",
        _note(cell),
    ]


def format_sweep(data: Dict[str, Any]) -> str:
    """The sweep's summary and per-family table, by package.

    Args:
        data (dict): ``zoo.py sweep``'s JSON.

    Returns:
        str: Markdown.
    """
    cells = data['cells']
    lines = []
    by_package = collections.defaultdict(list)
    for cell in cells:
        by_package[cell['family'].partition('/')[0]].append(cell)
    header = (
        '| package | families | '
        + ' | '.join(SHORT[k] for k in OUTCOMES)
        + ' |'
    )
    lines += [header, '|' + '---|' * (len(OUTCOMES) + 2)]
    for package, group in by_package.items():
        counts = collections.Counter(c['outcome'] for c in group)
        lines.append(
            f'| {package} | {len(group)} | '
            + ' | '.join(str(counts.get(k, 0)) for k in OUTCOMES)
            + ' |'
        )
    for package, group in by_package.items():
        lines += [
            '',
            f'#### {package}',
            '',
            '| family | config | fault | outcome | incident in iter 1 | '
            'step skipped | finite: weights/EMA/ckpt | wall s | note |',
            '|---|---|---|---|---|---|---|---|---|',
        ]
        lines += ['| ' + ' | '.join(_row(c)) + ' |' for c in group]
    return '\n'.join(lines) + '\n'


def cpu_impossible(cells: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """Missing CPU kernel (op) -> the families it stops."""
    out: Dict[str, List[str]] = collections.defaultdict(list)
    for cell in cells:
        if cell['outcome'] in ('cpu_kernel', 'cuda_only'):
            source = cell.get('bare') or cell['guard']
            out[_short(source.get('detail'), 80)].append(cell['family'])
    return dict(out)


def format_static(data: Dict[str, Any]) -> str:
    """The static pass's counts by package and the list of every config
    that is not ``ok``, upstream load failures apart.

    Args:
        data (dict): ``zoo.py static``'s JSON.

    Returns:
        str: Markdown.
    """
    configs = data['configs']
    lines = [
        '| package | configs | ' + ' | '.join(STATUSES) + ' | with a '
        'check turned off |',
        '|' + '---|' * (len(STATUSES) + 3),
    ]
    packages = sorted({c['config'].partition('::')[0] for c in configs})
    for package in packages:
        group = [c for c in configs if c['config'].startswith(package)]
        counts = collections.Counter(c['status'] for c in group)
        off = sum(bool(c.get('warnings')) for c in group)
        lines.append(
            f'| {package} | {len(group)} | '
            + ' | '.join(str(counts.get(s, 0)) for s in STATUSES)
            + f' | {off} |'
        )
    bad = [
        c for c in configs if c['status'] not in ('ok', 'upstream_load_error')
    ]
    lines += ['', f'Refused or broken by the include: {len(bad)}.']
    for c in bad:
        lines.append(
            f"* `{c['config']}`: {c['status']}: {_short(c.get('error'))}"
        )
    upstream = [c for c in configs if c['status'] == 'upstream_load_error']
    lines += ['', f'Configs that do not load upstream either: {len(upstream)}']
    causes = collections.defaultdict(list)
    for c in upstream:
        error = _short(c.get('error'), 300)
        key = re.sub(r"'[^']*'|\S*\.py", '...', error)[:90]
        causes[key].append(c['config'])
    for key, group in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        lines.append(
            f'* {len(group)} x `{key}`: '
            + ', '.join(f'`{g}`' for g in group[:6])
            + (' ...' if len(group) > 6 else '')
        )
    ops = collections.defaultdict(list)
    for c in configs:
        for op in c.get('cpu_kernels') or []:
            ops[op].append(c['config'])
    if ops:
        lines += [
            '',
            'Configs whose model uses a module that runs an mmcv op without '
            'a CPU kernel (`zoo_static.CPU_KERNEL_TYPES`): '
            f'{len({c for v in ops.values() for c in v})}',
        ]
        for op, group in sorted(ops.items()):
            lines.append(
                f'* `{op}`: {len(group)} ('
                + ', '.join(sorted({g.split('/')[0] for g in group}))
                + ')'
            )
    warnings = collections.Counter(
        w.split('. To turn')[0]
        for c in configs
        for w in c.get('warnings') or []
    )
    if warnings:
        lines += ['', 'Checks the include turned off (WARNING notes):']
        for text, n in warnings.most_common():
            lines.append(f'* {n} x {_short(text, 200)}')
    return '\n'.join(lines) + '\n'
