# mmnanguard protection for any mmdet / mmrotate / mmseg config: add
#   _base_ = [..., 'mmnanguard::_base_/nanguard.py']
# The runner (a registered Runner subclass, which the official tools/train.py
# of mmdet, mmrotate and mmseg build when `runner_type` is set) adds the
# NanGuardHook and the hooks below without touching custom_hooks,
# default_hooks or optim_wrapper. The scoped name makes mmengine import
# mmnanguard before anything is built. See
# mmnanguard/engine/runner/nanguard_runner.py.
runner_type = 'mmnanguard.NanGuardRunner'

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
