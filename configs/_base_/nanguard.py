# mmnanguard protection for any mmdet / mmrotate / mmseg config: add
#   _base_ = [..., 'mmnanguard::_base_/nanguard.py']
# The runner (a registered Runner subclass, which the official tools/train.py
# of mmdet, mmrotate and mmseg build when `runner_type` is set) adds the
# NanGuardHook and the hooks below without touching custom_hooks,
# default_hooks or optim_wrapper. The scoped name makes mmengine import
# mmnanguard before anything is built. See
# mmnanguard/engine/runner/nanguard_runner.py. When another base of the
# config sets `runner_type` (mmengine refuses a key set by two bases), use
# nanguard_settings.py instead (docs/distributed.md).
_base_ = './nanguard_settings.py'  # the `nanguard = dict(...)` settings

runner_type = 'mmnanguard.NanGuardRunner'
