# Strict protection: the first non-finite value stops training with
# NonFiniteTrainingError (iteration, loss terms, grad norm, report path).
_base_ = './nanguard_strict_settings.py'

runner_type = 'mmnanguard.NanGuardRunner'
