# Copyright (c) mmnanguard contributors. All rights reserved.
"""Scan a dataset through its config's own dataset and pipeline.

Used by ``tools/check_dataset.py``. Loading-only mode runs the leading
loading transforms of the pipeline (``Load*``, ``ConvertBoxType``,
``ConvertMask2BoxType``) and checks the sample after each of them, so that
quadrilaterals are checked before and rotated boxes after the conversion.
With ``augment_repeats=R`` it also runs the whole pipeline up to the
``Pack*`` transform ``R`` times per sample (seeded) and checks the result.
``ValidateAnnotations`` transforms in the pipeline are skipped: the scan
reports what they would filter.

For mmrotate's ``DOTADataset`` the data list is read line by line
(:mod:`.dota_annfile`), so problems carry the annfile line, and lines that
make ``DOTADataset`` raise are reported instead of aborting the scan.
"""

import copy
import random
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.registry import DATASETS, init_default_scope
from mmengine.utils import ProgressBar

from mmnanguard.optional import require_packages

from .annotation_records import coco_annotation_id, voc_object_index
from .dota_annfile import ANN_FILE_KEY, ANN_LINES_KEY, load_dota_data_list
from .scan_leaves import ScanLeaf, describe_leaves, leaf_of, scan_leaves
from .transforms.validate_annotations import check_results


def build_scan_dataset(
    cfg: Config, split: str
) -> Tuple[Any, List[Dict[str, Any]], str]:
    """Build the split's dataset, tolerant of DOTA lines it cannot load.

    Args:
        cfg (Config): The training config.
        split (str): ``'train'``, ``'val'`` or ``'test'``.

    Returns:
        tuple: ``(dataset, problems, upstream_error)``: the fully initialised
        dataset, the annfile problems and, for DOTA, the error upstream's
        loader raises on this folder (empty when it loads).

    Raises:
        ValueError: If the config has no dataloader for ``split``.
        MissingPackageError: If the config's scope names mmrotate or mmseg
            and it is not importable.
    """
    loader = cfg.get(f'{split}_dataloader')
    if not loader or not loader.get('dataset'):
        raise ValueError(
            f'the config has no {split}_dataloader.dataset '
            f'(it is {loader!r}); choose another --split'
        )
    require_packages(cfg, getattr(cfg, 'filename', None))
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    ds_cfg = copy.deepcopy(loader['dataset'])
    ds_cfg['lazy_init'] = True
    dataset = DATASETS.build(ds_cfg)
    problems: List[Dict[str, Any]] = []
    upstream_error = ''
    if _is_dota(dataset):
        data_list, problems = load_dota_data_list(dataset)
        try:
            upstream = type(dataset).load_data_list(dataset)
        except (KeyError, IndexError, ValueError) as err:
            upstream_error = f'{type(err).__name__}: {err}'
        else:
            _same_as_upstream(data_list, upstream)
        dataset.load_data_list = lambda: data_list
    dataset.full_init()
    return dataset, problems, upstream_error


def _is_dota(dataset: Any) -> bool:
    if not type(dataset).__module__.startswith('mmrotate'):
        return False
    from mmrotate.datasets import DOTADataset

    return isinstance(dataset, DOTADataset)


def _same_as_upstream(ours: List[dict], upstream: List[dict]) -> None:
    """Raise if the line-by-line reader disagrees with ``DOTADataset``."""

    def key(info):
        return info['img_path'], [
            (
                np.asarray(i['bbox']).tobytes(),
                i['bbox_label'],
                i['ignore_flag'],
            )
            for i in info['instances']
        ]

    if sorted(map(key, ours)) != sorted(map(key, upstream)):
        raise RuntimeError(
            'mmnanguard.datasets.dota_annfile read this '
            'folder differently from DOTADataset; please '
            'report this bug'
        )


def _locate(
    results: Dict[str, Any],
    violation: Any,
    loading: bool,
    coco_json: Optional[str] = None,
) -> Tuple[str, Optional[int], Optional[str]]:
    """File, annfile line and record (``'object 2'`` of a VOC xml,
    ``'annotation id 57'`` of a COCO json) of a violation.

    Records are named at the loading stages only (an augmentation may drop
    instances); ``coco_json`` is the dataset's annotation file (any
    other than a COCO json names nothing).
    """
    if violation.check == 'seg_values':
        return results.get('seg_map_path', ''), None, None
    if violation.index is None:
        return results.get('img_path', ''), None, None
    ann_file = results.get(ANN_FILE_KEY)
    if ann_file is not None:
        line = results[ANN_LINES_KEY][violation.index] if loading else None
        return ann_file, line, None
    boxes = results.get('gt_bboxes')
    count = len(boxes) if loading and boxes is not None else -1
    # VOC keeps each image's boxes in its own Annotations/*.xml
    xml = results.get('xml_path')
    if xml:
        found = voc_object_index(xml, violation.index, count, True)
        return xml, None, None if found is None else f'object {found}'
    if coco_json:
        img_id = results.get('img_id')
        ann_id = coco_annotation_id(
            coco_json, img_id, violation.index, count, True
        )
        if ann_id is not None:
            return coco_json, None, f'annotation id {ann_id}'
    return results.get('img_path', ''), None, None


def _seed(value: int) -> None:
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


class DatasetScan:
    """Scan a config's dataset; see the module docstring.

    Args:
        cfg (Config): The training config.
        split (str): ``'train'``, ``'val'`` or ``'test'``.
        augment_repeats (int): Full-pipeline runs per sample. 0 (default)
            only loads.
        min_size (float): ``ValidateAnnotations.min_size``.
        seed (int): Seed of the augmentation runs.
        sample_checks (Sequence): Checks of a sample's packed pipeline
            output, each with a ``kind`` and ``check(packed)`` returning
            one dict per problem (``img_path``, ``line``, ``values``),
            ``checked`` and
            ``error`` (e.g. the CTC label lengths of
            :class:`~mmnanguard.analysis.ctc_dataset_check.CtcAlignmentCheck`).
            Each sample then runs through the whole pipeline once (the
            first augmentation run when there are some).
    """

    def __init__(
        self,
        cfg: Config,
        split: str = 'train',
        augment_repeats: int = 0,
        min_size: float = 1.0,
        seed: int = 0,
        sample_checks: Sequence[Any] = (),
    ) -> None:
        if augment_repeats < 0:
            raise ValueError(
                f'augment_repeats must be >= 0, got ' f'{augment_repeats}'
            )
        self.cfg = cfg
        self.sample_checks = list(sample_checks)
        self.split = split
        self.augment_repeats = augment_repeats
        self.seed = seed
        self.dataset, self.problems, self.upstream_error = build_scan_dataset(
            cfg, split
        )
        self.leaves, wrapper_notes = scan_leaves(self.dataset)
        #: What the scan cannot check on this dataset, and why.
        self.not_checked: List[str] = list(wrapper_notes)
        for leaf in self.leaves:
            if leaf.num_classes is None:
                self.not_checked.append(
                    'label and segmentation value ranges: '
                    f'{type(leaf.dataset).__name__}.metainfo names no '
                    "'classes'"
                )
        self.min_size = min_size
        #: The samples scanned: those of the datasets that load (a
        #: ``RepeatDataset`` of 3 adds none).
        self.num_samples = sum(len(leaf.dataset) for leaf in self.leaves)
        self.num_instances = 0
        self.num_skipped = 0

    def _check_args(self, leaf: ScanLeaf) -> Dict[str, Any]:
        return dict(
            num_classes=leaf.num_classes,
            min_size=self.min_size,
            angle_version=self.cfg.get('angle_version'),
            ignore_index=getattr(leaf.dataset, 'ignore_index', 255),
        )

    def _record(
        self,
        leaf: ScanLeaf,
        results: Dict[str, Any],
        stage: str,
        loading: bool,
        seen: set,
    ) -> None:
        violations = check_results(
            results, negative_coords=loading, **self._check_args(leaf)
        )
        for v in violations:
            file, line, record = _locate(results, v, loading, leaf.ann_file)
            # loading stages: one entry per (line, check) over all stages
            place = '' if loading else stage
            key = (file, line, record, v.index, v.check, place)
            if key in seen:
                continue
            seen.add(key)
            self.problems.append(
                dict(
                    kind=v.check,
                    file=file,
                    line=line,
                    record=record,
                    instance=v.index,
                    stage=stage,
                    **{
                        k: val
                        for k, val in v.to_dict().items()
                        if k in ('values', 'detail')
                    },
                )
            )

    def _error(
        self, results: Dict[str, Any], stage: str, err: Exception
    ) -> None:
        file = results.get(ANN_FILE_KEY) or results.get('img_path', '')
        self.problems.append(
            dict(
                kind='pipeline_error',
                file=file,
                line=None,
                record=None,
                instance=None,
                stage=stage,
                values=[],
                detail=f'{type(err).__name__}: ' f'{err}',
            )
        )

    def scan_sample(self, idx: int) -> None:
        """Check sample ``idx`` (loading stage, then the repeats)."""
        leaf, local = leaf_of(self.leaves, idx)
        data_info = leaf.dataset.get_data_info(local)
        self.num_instances += len(data_info.get('instances', []))
        results = data_info
        seen: Set[Tuple[Any, ...]] = set()
        for transform in leaf.loading:
            stage = type(transform).__name__
            try:
                results = transform(results)
            except Exception as err:  # reported as a problem, not masked
                self._error(results, stage, err)
                return
            self._record(leaf, results, stage, True, seen)
        first = None
        for r in range(max(self.augment_repeats, bool(self.sample_checks))):
            out = self._augmented(leaf, results, r, idx)
            if out is not None and r < self.augment_repeats:
                self._record(leaf, out, f'augment[{r}]', False, seen)
            if r == 0:
                first = out
        packed = self._packed(leaf, first) if first is not None else None
        if packed is not None:
            for check in self.sample_checks:
                self._record_sample_check(check, packed)

    def _augmented(
        self, leaf: ScanLeaf, results: Dict[str, Any], r: int, idx: int
    ) -> Optional[Dict[str, Any]]:
        """Augmentation run ``r`` of sample ``idx`` (seeded), or None when
        a transform dropped the sample or raised (recorded)."""
        _seed(self.seed + r * self.num_samples + idx)
        out: Optional[Dict[str, Any]] = copy.deepcopy(results)
        stage = f'augment[{r}]'
        for transform in leaf.augment:
            try:
                out = transform(out)
            except Exception as err:  # reported as a problem
                name = type(transform).__name__
                self._error(results, f'{stage} {name}', err)
                return None
            if out is None:
                # the run for the sample checks alone is not counted
                self.num_skipped += r < self.augment_repeats
                return None
        return out

    def _packed(
        self, leaf: ScanLeaf, results: Dict[str, Any]
    ) -> Optional[Dict[str, Any]]:
        """``results`` (an augmentation run's own copy, checked already)
        through the leaf's ``Pack*`` transforms (what the model receives),
        or None when packing raised (recorded)."""
        out: Optional[Dict[str, Any]] = results
        for transform in leaf.packing:
            try:
                out = transform(out)
            except Exception as err:  # reported as a problem
                self._error(results, type(transform).__name__, err)
                return None
        return out

    def _record_sample_check(self, check: Any, packed: Dict[str, Any]) -> None:
        for found in check.check(packed):
            self.problems.append(
                dict(
                    kind=check.kind,
                    file=found.get('img_path') or '',
                    line=None,
                    record=None,
                    instance=None,
                    stage='model forward',
                    values=found.get('values', []),
                    detail=found['line'],
                )
            )

    def run(self, progress: bool = True) -> Dict[str, Any]:
        """Scan every sample.

        Args:
            progress (bool): Show a progress bar on stderr.

        Returns:
            dict: The report (see :func:`format_report`).
        """
        import sys

        num = self.num_samples
        bar = ProgressBar(num, file=sys.stderr) if progress else None
        start = time.perf_counter()
        for idx in range(num):
            self.scan_sample(idx)
            if bar is not None:
                bar.update()
        seconds = time.perf_counter() - start
        if bar is not None:
            sys.stderr.write('\n')
        self.problems.sort(
            key=lambda p: (
                p['file'],
                p['line'] or 0,
                p['instance'] if p['instance'] is not None else -1,
                p['kind'],
            )
        )
        return dict(
            split=self.split,
            dataset=type(self.dataset).__name__,
            augment_repeats=self.augment_repeats,
            loading_transforms=list(
                dict.fromkeys(
                    type(t).__name__
                    for leaf in self.leaves
                    for t in leaf.loading
                )
            ),
            **describe_leaves(self.leaves),
            num_samples=num,
            num_instances=self.num_instances,
            num_skipped_by_pipeline=self.num_skipped,
            seconds=seconds,
            images_per_second=num / seconds if seconds > 0 else None,
            upstream_load_error=self.upstream_error,
            counts=dict(Counter(p['kind'] for p in self.problems)),
            not_checked=self.not_checked
            + [c.error for c in self.sample_checks if c.error],
            sample_checks={c.kind: c.checked for c in self.sample_checks},
            problems=self.problems,
        )


def format_report(report: Dict[str, Any], max_rows: int = 100) -> str:
    """Tables of a scan report: problems by kind, then one row each.

    Args:
        report (dict): From :meth:`DatasetScan.run`.
        max_rows (int): Most problem rows printed. Defaults to 100.

    Returns:
        str: The text.
    """
    problems = report['problems']
    head = (
        f"{report['dataset']} ({report['split']}): "
        f"{report['num_samples']} samples, {report['num_instances']} "
        f"instances, {len(problems)} problem(s) in "
        f"{report['seconds']:.2f} s"
    )
    lines = [head]
    if report['upstream_load_error']:
        lines.append(
            f"{report['dataset']} itself cannot load this folder: "
            f"{report['upstream_load_error']}"
        )
    lines += [
        f'Also checked: {kind}, {count} sample(s) through the model'
        for kind, count in (report.get('sample_checks') or {}).items()
    ]
    lines += [f'Not checked: {text}' for text in report.get('not_checked', [])]
    if not problems:
        return '\n'.join(lines + ['No problems found.'])
    by_kind: Dict[str, List[dict]] = {}
    for p in problems:
        by_kind.setdefault(p['kind'], []).append(p)
    rows: List[Tuple[str, ...]] = [('kind', 'count', 'files')]
    for kind, items in sorted(by_kind.items()):
        files = sorted({p['file'] for p in items})
        shown = ', '.join(files[:3]) + (
            f' (+{len(files) - 3} more)' if len(files) > 3 else ''
        )
        rows.append((kind, str(len(items)), shown))
    lines += ['', _table(rows), '']
    rows = [('kind', 'file', 'line', 'record', 'instance', 'stage', 'detail')]
    for p in problems[:max_rows]:
        rows.append(
            (
                p['kind'],
                p['file'],
                '' if p['line'] is None else str(p['line']),
                p.get('record') or '',
                '' if p['instance'] is None else str(p['instance']),
                p['stage'],
                p['detail'],
            )
        )
    lines.append(_table(rows))
    if len(problems) > max_rows:
        lines.append(f'... {len(problems) - max_rows} more rows (see --out)')
    return '\n'.join(lines)


def _table(rows: List[Tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        out.append(' | '.join(c.ljust(w) for c, w in zip(row, widths)))
        if n == 0:
            out.append('-+-'.join('-' * w for w in widths))
    return '\n'.join(line.rstrip() for line in out)
