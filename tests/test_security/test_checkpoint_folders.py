# Copyright (c) mmnanguard contributors. All rights reserved.
"""Checkpoint folders (DeepSpeed, FSDP1 local): which ones a resume takes,
and what a crafted one may make it do.

A protected resume passed over every folder checkpoint ("it is not a
regular file") and trained from scratch beside them; DeepSpeed itself
loads every part with ``weights_only=False``. Now a folder of regular
``torch.save`` files, one holding the run's state, is a candidate; a
part cut short, a link or a folder inside, or a part holding code is
named; DeepSpeed's own load runs nothing (``compat/
deepspeed_checkpoint_load.py``). The real DeepSpeed resume from a folder
is ``tests/test_distributed/test_deepspeed.py`` and
``test_preemption_ddp.py``.
"""

import os
import os.path as osp

import crafted_files as crafted
import pytest
import torch

from mmnanguard.compat.checkpoint_allowlist import UntrustedCheckpointError
from mmnanguard.compat.deepspeed_checkpoint_load import (
    deepspeed_checkpoint_globals,
    load_checkpoint_part,
)
from mmnanguard.fileio.checkpoint_folder import checkpoint_parts
from mmnanguard.fileio.checkpoint_verify import (
    candidate_checkpoints,
    checkpoint_problem,
)

HAS_DEEPSPEED = __import__('importlib').util.find_spec('deepspeed') is not None


def _state_part(path: str) -> dict:
    state = dict(
        module=dict(weight=torch.arange(4.0)),
        meta=dict(epoch=0, iter=6),
        message_hub=dict(log_scalars={}, runtime_info={}),
    )
    torch.save(state, path)
    return state


def _folder(root, name: str = 'iter_6.pth') -> str:
    folder = root / name
    folder.mkdir()
    _state_part(str(folder / 'mp_rank_00_model_states.pt'))
    for rank in (0, 1):
        torch.save(
            dict(optimizer_state_dict=dict(fp32=torch.ones(2) * rank)),
            str(folder / f'zero_pp_rank_{rank}_mp_rank_00_optim_states.pt'),
        )
    return str(folder)


def test_a_complete_folder_is_a_checkpoint(tmp_path):
    folder = _folder(tmp_path)
    problem, parts = checkpoint_parts(folder)
    assert problem is None and len(parts) == 3
    assert checkpoint_problem(folder) is None
    assert checkpoint_problem(folder, load=True) is None
    assert candidate_checkpoints(str(tmp_path)) == [folder]


def test_a_link_to_a_folder_is_no_candidate(tmp_path):
    outside = tmp_path / 'outside'
    outside.mkdir()
    work = tmp_path / 'work'
    work.mkdir()
    os.symlink(_folder(outside), work / 'iter_6.pth')
    assert candidate_checkpoints(str(work)) == []


@pytest.mark.parametrize(
    'damage, expected',
    [
        ('empty', 'it is an empty folder'),
        (
            'cut',
            "its part 'zero_pp_rank_1_mp_rank_00_optim_states.pt': it is "
            'not a complete zip archive',
        ),
        (
            'zero',
            "its part 'zero_pp_rank_1_mp_rank_00_optim_states.pt' is " 'empty',
        ),
        ('link', "its entry 'zz_link' is not a regular file"),
        ('subfolder', "its entry 'zz_sub' is not a regular file"),
        ('no_state', "none of its parts holds ['meta', 'message_hub']"),
    ],
)
def test_a_damaged_folder_is_named(tmp_path, damage, expected):
    folder = _folder(tmp_path)
    part = osp.join(folder, 'zero_pp_rank_1_mp_rank_00_optim_states.pt')
    if damage == 'empty':
        for name in os.listdir(folder):
            os.unlink(osp.join(folder, name))
    elif damage == 'cut':
        data = open(part, 'rb').read()
        open(part, 'wb').write(data[: len(data) // 2])
    elif damage == 'zero':
        open(part, 'wb').close()
    elif damage == 'link':
        os.symlink('/etc/hostname', osp.join(folder, 'zz_link'))
    elif damage == 'subfolder':
        os.mkdir(osp.join(folder, 'zz_sub'))
    else:
        os.unlink(osp.join(folder, 'mp_rank_00_model_states.pt'))
    assert checkpoint_problem(folder).startswith(expected)


def test_a_part_holding_code_is_refused_on_load(tmp_path):
    folder = _folder(tmp_path)
    marker = tmp_path / 'ran'
    part = osp.join(folder, 'mp_rank_00_model_states.pt')
    payload = dict(
        meta=dict(epoch=0, iter=6),
        message_hub=crafted.Call(os.system, crafted.shell(str(marker))),
    )
    crafted.write_zip(part, crafted.dumps(payload))
    # the cheap check reads the structure only; the load refuses the call
    assert checkpoint_problem(folder) is None
    problem = checkpoint_problem(folder, load=True)
    assert problem is not None and 'does not load' in problem
    with pytest.raises(UntrustedCheckpointError, match='model_states'):
        load_checkpoint_part(part)
    assert not marker.exists()


def test_the_part_allowlist_is_mmengines_and_the_four_classes():
    from mmengine.config import ConfigDict

    from mmnanguard.compat.checkpoint_allowlist import (
        mmengine_checkpoint_globals,
    )

    extra = deepspeed_checkpoint_globals()[
        len(mmengine_checkpoint_globals()) :
    ]
    names = sorted(f'{c.__module__}.{c.__qualname__}' for c in extra)
    expected = ['mmengine.config.config.ConfigDict']
    if HAS_DEEPSPEED:
        expected += [
            'deepspeed.runtime.fp16.loss_scaler.LossScaler',
            'deepspeed.runtime.zero.config.ZeroStageEnum',
            'deepspeed.utils.tensor_fragment.fragment_address',
        ]
    assert names == sorted(expected)
    assert ConfigDict in extra


@pytest.mark.skipif(not HAS_DEEPSPEED, reason='the stack has no deepspeed')
def test_deepspeed_loads_its_parts_with_the_allowlist(tmp_path):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
        TorchCheckpointEngine,
    )
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    from mmengine.config import ConfigDict

    from mmnanguard.compat import APPLIED

    assert APPLIED['deepspeed_checkpoint_load']
    engine = TorchCheckpointEngine()
    path = str(tmp_path / 'part.pt')
    saved = dict(
        stage=ZeroStageEnum.gradients,
        address=fragment_address(numel=4, start=2),
        config=ConfigDict(zero_optimization=dict(stage=2)),
        fp32=torch.arange(3.0),
    )
    torch.save(saved, path)
    loaded = engine.load(path, map_location='cpu')
    assert loaded['stage'] is ZeroStageEnum.gradients
    assert loaded['address'] == fragment_address(numel=4, start=2)
    assert loaded['config'] == dict(zero_optimization=dict(stage=2))
    assert torch.equal(loaded['fp32'], torch.arange(3.0))
    marker = tmp_path / 'ran'
    crafted.write_zip(path, crafted.foreign_call(str(marker)))
    with pytest.raises(UntrustedCheckpointError, match='part.pt'):
        engine.load(path, map_location='cpu')
    assert not marker.exists()
