# The settings of nanguard_strict.py (explained there) without its `runner_type`
# line: use it instead of nanguard_strict.py when another base of the config
# sets `runner_type` (see nanguard_settings.py).
_base_ = './nanguard_settings.py'

nanguard = dict(policy='raise', validate_annotations=dict(policy='raise'))
