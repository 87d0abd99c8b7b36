# Strict protection: the first non-finite value stops training with
# NonFiniteTrainingError (iteration, loss terms, grad norm, report path),
# and an annotation file that fails ValidateAnnotations stops it too
# (validate_annotations=dict(policy='raise')).
_base_ = './nanguard_strict_settings.py'

runner_type = 'mmnanguard.NanGuardRunner'
