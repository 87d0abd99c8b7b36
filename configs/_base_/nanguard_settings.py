# mmnanguard's protection settings alone: the include nanguard.py without
# its `runner_type` line. Use it INSTEAD of nanguard.py when another base
# of your config sets `runner_type` (mmengine refuses two bases that set the
# same key), e.g. an upstream FlexibleRunner config:
#   _base_ = ['mmpretrain::mae/benchmarks/'
#             'vit-large-p16_8xb128-fsdp-coslr-50e_in1k.py',
#             'mmnanguard::_base_/nanguard_settings.py']
#   runner_type = 'mmnanguard.NanGuardFlexibleRunner'  # for the official
#   # tools/train.py; mmnanguard's tools/train.py selects it by itself
# (see docs/distributed.md, "One include for every runner").
nanguard = dict(
    # NanGuardHook settings (mmnanguard.engine.guard.GuardSettings)
    policy='skip',  # raise | skip | rollback | off
    max_consecutive_skips=5,
    escalate_to='rollback',  # when skipping is not enough
    snapshot_interval=50,
    lr_backoff=0.5,
    max_rollbacks=3,
    # loss / grad-norm spikes (> factor x the running max of the last
    # `window` values): 'log' records them (counter, log line, incident ring
    # buffer) and changes nothing; 'skip' or 'rollback' act on them
    spike=dict(action='log', factor=10.0, window=50),
    # more protection hooks, one per line (when='amp': AMP optim wrappers
    # only); each is added unless the config already has one of its type
    hooks=[
        dict(type='AmpScaleMonitorHook', when='amp'),  # loss-scale collapse
        # replay + cause of every distinct incident
        dict(type='NanDiagnosisHook'),
    ],
    # every built CrossEntropyLoss that takes class labels is wrapped by
    # CheckedCrossEntropyLoss (mask losses and binary targets are left
    # alone): a label outside [0, num_classes) (e.g. Cityscapes 255) raises
    # an error naming it
    check_labels=True,
    # ValidateAnnotations before Pack*Inputs (also in a PipelineSwitchHook's
    # pipeline); num_classes, angle_version and ignore_index are read off
    # the built model (where they cannot be, the check is off, with one
    # warning giving the line to set them). 'warn' names a bad file and keeps
    # the sample (the guard handles what follows); 'filter' drops the bad
    # instances; None turns the check off.
    validate_annotations=dict(policy='warn'),
)
