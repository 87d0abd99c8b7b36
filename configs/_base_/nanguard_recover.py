# Recovering protection: every incident rolls back to the last known-good
# state (model, optimizer, GradScaler, schedulers, EMA) and halves the
# learning rates; after max_rollbacks it stops with NonFiniteTrainingError.
_base_ = './nanguard_recover_settings.py'

runner_type = 'mmnanguard.NanGuardRunner'
