# Recovering protection: every incident rolls back to the last known-good
# state (model, optimizer, GradScaler, schedulers, EMA) and halves the
# learning rates; after max_rollbacks it stops with NonFiniteTrainingError.
_base_ = './nanguard.py'

nanguard = dict(
    policy='rollback',
    lr_backoff=0.5,
    max_rollbacks=3,
    snapshot_interval=50,
    rollback_source='memory',
)
