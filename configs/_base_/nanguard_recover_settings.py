# The settings of nanguard_recover.py (explained there) without its `runner_type`
# line: use it instead of nanguard_recover.py when another base of the config
# sets `runner_type` (see nanguard_settings.py).
_base_ = './nanguard_settings.py'

nanguard = dict(
    policy='rollback',
    lr_backoff=0.5,
    max_rollbacks=3,
    snapshot_interval=50,
    rollback_source='memory',
)
