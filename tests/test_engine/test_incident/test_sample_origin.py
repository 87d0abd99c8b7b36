# Copyright (c) mmnanguard contributors. All rights reserved.
"""``KeepSampleOrigin`` on mmengine's own datasets and data elements: the
dataset index and the file fields of the data info reach the packed data
sample's metainfo where its packing transform dropped them, through
``ConcatDataset``, and the batch records name the file (or the index)."""

import pytest
import torch
from mmengine.dataset import BaseDataset, ConcatDataset, pseudo_collate
from mmengine.structures import BaseDataElement

from mmnanguard.engine.diagnosis.report_md import _sample_name
from mmnanguard.engine.incident.batch_layout import sample_sources
from mmnanguard.engine.incident.sample_origin import (
    KeepSampleOrigin,
    keep_sample_origin,
    origin_fields,
)


class PackKeepingNothing:
    """A packing transform that keeps no metainfo (as mmaction2's
    ``PackActionInputs`` keeps no ``filename``)."""

    def __call__(self, results):
        sample = BaseDataElement(metainfo=dict(img_shape=(4, 4)))
        return dict(inputs=torch.zeros(3, 4, 4), data_samples=sample)


class ListDataset(BaseDataset):
    """Data infos given in memory; ``field`` names each sample's file."""

    def __init__(self, files, field='filename', **kwargs):
        self._files, self._field = files, field
        super().__init__(pipeline=[PackKeepingNothing()], **kwargs)

    def load_data_list(self):
        return [
            {self._field: f, 'label': i} for i, f in enumerate(self._files)
        ]


@pytest.mark.parametrize(
    'info, expected',
    [
        (
            dict(filename='a.mp4', sample_idx=3),
            dict(filename='a.mp4', sample_idx=3),
        ),
        (dict(frame_dir='clips/a', label=1), dict(frame_dir='clips/a')),
        (dict(img_path='x.png', text='hello'), dict(img_path='x.png')),
        (
            dict(file_name='P0001.png', gt_path='hr/1.png', flip='x'),
            dict(file_name='P0001.png', gt_path='hr/1.png'),
        ),
        # a key that only contains such a word names no file
        (dict(flip_direction='horizontal', profile='a'), {}),
        # empty strings, non-strings, and a bool index are not origins
        (dict(filename='', sample_idx=True, file_id=7), {}),
        ('not a dict', {}),
    ],
)
def test_origin_fields(info, expected):
    assert origin_fields(info) == expected


def test_the_packed_sample_gets_the_missing_origin(tmp_path):
    video = tmp_path / 'clip.mp4'
    video.write_bytes(b'')
    dataset = ListDataset([str(video), str(tmp_path / 'gone.mp4')])
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, collate_fn=pseudo_collate
    )
    assert keep_sample_origin(loader) is loader
    keep_sample_origin(loader)  # once: not wrapped twice
    assert type(dataset.pipeline) is KeepSampleOrigin
    assert type(dataset.pipeline.pipeline).__name__ == 'Compose'
    first = dataset[0]['data_samples'].metainfo
    assert first == dict(img_shape=(4, 4), filename=str(video), sample_idx=0)
    sources = sample_sources(next(iter(loader)))
    # an existing file is named by its field; a missing one leaves the index
    assert sources[0] == dict(
        img_path=str(video),
        img_id=None,
        seg_map_path=None,
        path_field='filename',
    )
    assert sources[1] == dict(
        img_path=None, img_id=None, seg_map_path=None, sample_idx=1
    )
    assert _sample_name(sources[0]) == 'clip.mp4 (filename)'
    assert _sample_name(sources[1]) == 'dataset index 1 (no file named)'


def test_a_kept_key_is_not_overwritten():
    class PackKeepingPath(PackKeepingNothing):
        def __call__(self, results):
            out = super().__call__(results)
            out['data_samples'].set_metainfo(dict(img_path='packed.png'))
            return out

    wrapped = KeepSampleOrigin(PackKeepingPath())
    out = wrapped(dict(img_path='raw.png', sample_idx=5))
    assert out['data_samples'].metainfo['img_path'] == 'packed.png'
    assert out['data_samples'].metainfo['sample_idx'] == 5
    # a pipeline that drops the sample (returns None) is passed through
    assert KeepSampleOrigin(lambda info: None)(dict(sample_idx=1)) is None


def test_every_dataset_of_a_concat_is_wrapped(tmp_path):
    parts = [ListDataset(['a.mp4']), ListDataset(['b', 'c'], 'frame_dir')]
    loader = torch.utils.data.DataLoader(
        ConcatDataset(parts), batch_size=3, collate_fn=pseudo_collate
    )
    keep_sample_origin(loader)
    assert all(type(p.pipeline) is KeepSampleOrigin for p in parts)
    metas = [loader.dataset[i]['data_samples'].metainfo for i in range(3)]
    assert [m.get('filename') or m.get('frame_dir') for m in metas] == [
        'a.mp4',
        'b',
        'c',
    ]
    # the index within its own dataset, as get_data_info gives it
    assert [m['sample_idx'] for m in metas] == [0, 0, 1]
