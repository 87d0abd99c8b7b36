# Copyright (c) mmnanguard contributors. All rights reserved.
"""A line-by-line reader of DOTA annfiles that reports what mmrotate's
``DOTADataset`` cannot load.

``DOTADataset.load_data_list`` (mmrotate 1.0.0rc1) parses each line as
``x1 y1 ... x4 y4 class difficulty`` and raises on the first bad line of
the whole folder: ``KeyError`` for a class outside ``metainfo['classes']``,
``IndexError`` for fewer than 10 fields (or a blank line), ``ValueError``
for a non-number. ``nan`` and ``inf`` parse as floats and load silently.

:func:`load_dota_data_list` builds the same data list as upstream, skips
the lines that upstream cannot load, reports each with its file and 1-based
line, and records for every instance the line it came from
(``data_info['nanguard_ann_lines']``).
"""

import glob
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Keys added to each ``data_info`` by :func:`load_dota_data_list`.
ANN_FILE_KEY = 'nanguard_ann_file'
ANN_LINES_KEY = 'nanguard_ann_lines'


def parse_dota_line(
    text: str, cls_map: Dict[str, int], diff_thr: int
) -> Tuple[Optional[Dict[str, Any]], str, str]:
    """Parse one annfile line in ``DOTADataset``'s order of operations.

    Args:
        text (str): The line.
        cls_map (dict): Class name to label.
        diff_thr (int): Difficulty above which ``ignore_flag`` is 1.

    Returns:
        tuple[dict | None, str, str]: ``(instance, kind, detail)``: the
        instance dict (``bbox``, ``bbox_label``, ``ignore_flag``) and empty
        strings, or ``None`` and the problem kind (``'unknown_class'``,
        ``'malformed_line'``, ``'bad_number'``) with the error upstream
        raises.
    """
    fields = text.split()
    try:
        bbox = [float(v) for v in fields[:8]]
    except ValueError as err:
        return None, 'bad_number', f'ValueError: {err}'
    if len(fields) < 10:
        return (
            None,
            'malformed_line',
            (
                f'{len(fields)} fields, need 10 (x1 y1 ... x4 y4 class '
                f'difficulty); DOTADataset raises IndexError'
            ),
        )
    if fields[8] not in cls_map:
        return (
            None,
            'unknown_class',
            (
                f'class {fields[8]!r} is not in the dataset classes; '
                f'DOTADataset raises KeyError: {fields[8]!r}'
            ),
        )
    try:
        difficulty = int(fields[9])
    except ValueError as err:
        return None, 'bad_number', f'ValueError: {err}'
    instance = dict(
        bbox=bbox,
        bbox_label=cls_map[fields[8]],
        ignore_flag=int(difficulty > diff_thr),
    )
    return instance, '', ''


def parse_dota_annfile(
    path: str, classes: Sequence[str], diff_thr: int
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Parse one annfile.

    Args:
        path (str): The ``.txt`` annfile.
        classes (Sequence[str]): ``metainfo['classes']``.
        diff_thr (int): ``DOTADataset.diff_thr``.

    Returns:
        tuple: ``(instances, problems)``. Each instance has an extra
        ``line``; each problem has ``kind``, ``file``, ``line``,
        ``values`` (the raw line) and ``detail``.
    """
    cls_map = {c: i for i, c in enumerate(classes)}
    instances: List[Dict[str, Any]] = []
    problems: List[Dict[str, Any]] = []
    with open(path) as f:
        for number, text in enumerate(f.readlines(), start=1):
            instance, kind, detail = parse_dota_line(text, cls_map, diff_thr)
            if instance is None:
                problems.append(
                    dict(
                        kind=kind,
                        file=path,
                        line=number,
                        instance=None,
                        stage='annfile',
                        values=[text.rstrip('\n')],
                        detail=detail,
                    )
                )
            else:
                instance['line'] = number
                instances.append(instance)
    return instances, problems


def load_dota_data_list(
    dataset: Any,
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The data list ``dataset.load_data_list()`` would build, minus the
    lines it cannot load.

    Args:
        dataset: An mmrotate ``DOTADataset`` (or subclass) built with
            ``lazy_init=True`` and a non-empty ``ann_file``.

    Returns:
        tuple: ``(data_list, problems)``. Each ``data_info`` carries
        ``nanguard_ann_file`` and ``nanguard_ann_lines`` (the line of each
        instance).

    Raises:
        ValueError: If ``ann_file`` is empty or holds no ``.txt`` file.
    """
    if dataset.ann_file == '':
        raise ValueError(
            'DOTADataset with ann_file="" has no annotations ' 'to check'
        )
    txt_files = glob.glob(osp.join(dataset.ann_file, '*.txt'))
    if not txt_files:
        raise ValueError(f'There is no txt file in {dataset.ann_file}')
    classes = dataset.metainfo['classes']
    # mmrotate 1.0.0rc1: a fixed ``img_shape`` sets height/width and images
    # are .png; onedl-mmrotate 1.2.1: no height/width, ``img_suffix``
    img_shape = getattr(dataset, 'img_shape', None)
    suffix = getattr(dataset, 'img_suffix', 'png')
    data_list, problems = [], []
    for txt_file in txt_files:
        img_id = osp.split(txt_file)[1][:-4]
        instances, found = parse_dota_annfile(
            txt_file, classes, dataset.diff_thr
        )
        problems += found
        lines = [instance.pop('line') for instance in instances]
        file_name = f'{img_id}.{suffix}'
        data_info = {
            'img_id': img_id,
            'file_name': file_name,
            'img_path': osp.join(dataset.data_prefix['img_path'], file_name),
            'instances': instances,
            ANN_FILE_KEY: txt_file,
            ANN_LINES_KEY: lines,
        }
        if img_shape is not None:
            data_info['height'], data_info['width'] = img_shape[:2]
        data_list.append(data_info)
    return data_list, problems


def annfile_beside(img_path: Any) -> str:
    """The DOTA annfile of an image in mmrotate's folder layout
    (``<split>/images/P0001.png`` -> ``<split>/annfiles/P0001.txt``), ''
    where the image is not in an ``images`` folder or the annfile is
    missing. ``DOTADataset`` keeps no annfile path in its samples; this
    is how the training-time check names one.

    Args:
        img_path: The sample's ``img_path``.

    Returns:
        str: The annfile, or ''.
    """
    if not isinstance(img_path, str):
        return ''
    folder, name = osp.split(img_path)
    if osp.basename(folder) != 'images':
        return ''
    annfile = osp.join(
        osp.dirname(folder), 'annfiles', osp.splitext(name)[0] + '.txt'
    )
    return annfile if osp.isfile(annfile) else ''


def annfile_line_count(annfile: str) -> int:
    """The number of lines of ``annfile`` (each is one ``DOTADataset``
    instance, in order)."""
    with open(annfile, encoding='utf-8') as f:
        return len(f.read().splitlines())
