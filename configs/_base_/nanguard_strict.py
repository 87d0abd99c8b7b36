# Strict protection: the first non-finite value stops training with
# NonFiniteTrainingError (iteration, loss terms, grad norm, report path).
_base_ = './nanguard.py'

nanguard = dict(policy='raise', validate_annotations=dict(policy='raise'))
