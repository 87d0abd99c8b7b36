# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every Python snippet in README.md and docs/ runs as written.

A config snippet (one that sets ``_base_``, ``custom_hooks`` or
``nanguard``) is written to a file, with ``./my_detector.py`` standing for
the project's tiny RetinaNet and a snippet without ``_base_`` put on top of
it; it is loaded with ``Config.fromfile`` and built the way the upstream
train scripts build it (``RUNNERS.build`` when it sets ``runner_type``,
else ``Runner.from_cfg``). The built runner must carry the protection the
snippet asks for. Any other snippet is executed as a script.
"""

import glob
import importlib.util
import os.path as osp
import re
import runpy
from typing import List, Tuple

import pytest
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.engine.runner import NanGuardFlexibleRunner, NanGuardRunner
from mmnanguard.optional import is_available

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(REPO, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py')
FENCE = re.compile(r'^```python\n(.*?)^```', re.M | re.S)


def _snippets() -> List[Tuple[str, int, str]]:
    found = []
    for path in [osp.join(REPO, 'README.md')] + sorted(
        glob.glob(osp.join(REPO, 'docs', '*.md'))
    ):
        text = open(path, encoding='utf-8').read()
        for match in FENCE.finditer(text):
            line = text[: match.start()].count('\n') + 1
            found.append((osp.relpath(path, REPO), line, match.group(1)))
    return found


SNIPPETS = _snippets()


def _is_config(code: str) -> bool:
    return bool(re.search(r'^(_base_|custom_hooks|nanguard)\s*=', code, re.M))


def _run_script(code: str, tmp_path) -> None:
    """Run a script snippet and its ``test_*`` functions; an
    ``# AssertionError: ...`` comment in it is the failure it must show
    (its user's loss, ``MyLoss``, is ``snippet_losses.MyLoss``)."""
    import snippet_losses  # noqa: F401  (registers MyLoss)

    path = tmp_path / 'snippet.py'
    path.write_text(code)
    namespace = runpy.run_path(str(path))
    expected = re.findall(r'# AssertionError: (.*)', code)
    tests = [v for k, v in namespace.items() if k.startswith('test_')]
    assert tests
    for test in tests:
        if not expected:
            test()
            continue
        with pytest.raises(AssertionError) as caught:
            test()
        shown = str(caught.value)
        assert expected[0] in shown, shown
        for line in re.findall(r'^\s*#\s{3}(.*)', code, re.M):
            assert line.strip() in shown, shown


def test_the_docs_have_snippets():
    assert len(SNIPPETS) >= 6
    assert any(_is_config(code) for _, _, code in SNIPPETS)


@pytest.mark.parametrize(
    'code', [s[2] for s in SNIPPETS], ids=[f'{s[0]}:{s[1]}' for s in SNIPPETS]
)
def test_snippet_runs(code, tmp_path, monkeypatch):
    if 'DeepSpeedStrategy' in code and not importlib.util.find_spec(
        'deepspeed'
    ):
        pytest.skip('deepspeed is not installed in this stack')
    if 'mmrotate::' in code and not is_available('mmrotate'):
        pytest.skip('mmrotate is not installed in this stack')
    monkeypatch.chdir(tmp_path)
    if not _is_config(code):
        _run_script(code, tmp_path)
        return
    code = code.replace('./my_detector.py', TINY)
    bases = re.search(r'^_base_\s*=\s*\[(.*?)\]', code, re.M | re.S)
    if bases is None:
        code = f'_base_ = [{TINY!r}]\n' + code
    elif all(
        'mmnanguard::' in b for b in bases.group(1).split(',') if b.strip()
    ):
        # the include alone, as added to "the config you already have"
        code = code.replace(
            bases.group(0), f'_base_ = [{TINY!r}, {bases.group(1)}]'
        )
    path = tmp_path / 'snippet_config.py'
    path.write_text(code)
    cfg = Config.fromfile(str(path))
    cfg.work_dir = str(tmp_path / 'work')
    cfg.launcher = 'none'
    if 'runner_type' in cfg:
        runner = RUNNERS.build(cfg)
    else:
        runner = Runner.from_cfg(cfg)
    hooks = [h for h in runner.hooks if isinstance(h, NanGuardHook)]
    assert len(hooks) == 1, [type(h).__name__ for h in runner.hooks]
    if 'strategy' in cfg:
        assert isinstance(runner, NanGuardFlexibleRunner)
    elif 'custom_hooks' not in code:
        assert isinstance(runner, NanGuardRunner)
    asked = cfg.get('nanguard') or {}
    for key in ('policy', 'lr_backoff', 'rollback_source'):
        if key in asked:
            assert getattr(hooks[0].settings, key) == asked[key]
