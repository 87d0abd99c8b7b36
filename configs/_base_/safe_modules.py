# mmnanguard's protection plus the numerically safe drop-ins, for any mmdet,
# mmrotate or mmseg config. Use it INSTEAD of nanguard.py (it includes it):
#   _base_ = [..., 'mmnanguard::_base_/safe_modules.py']
# The runner swaps module types wherever they appear in the model config
# and keeps every argument (each swap is logged with its config path), so
# no `model` key is defined here (a second base defining `model` would be a
# duplicate key). Each safe module accepts every argument of the module it
# replaces and returns the same values wherever upstream's are finite:
# * StableFocalLoss for mmdet's FocalLoss: log-sigmoid form in fp32, finite
#   loss and gradients for any logit. Type names are resolved in the
#   config's default_scope: in an mmseg config a bare 'FocalLoss' is
#   mmseg's own, another loss, and is kept;
# * SafeGDLoss for mmrotate's GDLoss: closed-form determinants, so thin
#   boxes no longer give log(det <= 0) = NaN (rotated RTMDet with 'kld');
# * SafeRotatedIoULoss for mmrotate's RotatedIoULoss: plain PyTorch, so it
#   also runs on the CPU (mmcv 2.0.1 has only a CUDA kernel for it);
# * SafeDeltaXYWHTRBBoxCoder for DeltaXYWHTRBBoxCoder: a zero-width box
#   encodes to a finite target instead of log(0) = -inf;
# * SafeDiceLoss for mmdet's and mmseg's DiceLoss: sums in fp32, 0 / 0
#   defined.
# mmrotate's GDLoss_v1 gets no drop-in: the NaN users report with it, from
# the first iteration, comes from feeding it encoded deltas (its head's
# reg_decoded_bbox=False), which no drop-in can fix; the fix is
# reg_decoded_bbox=True in the head (tools/doctor.py reports it). Its
# degenerate-box failures (zero width, fp16/bf16) are listed by
# tools/check_loss.py. The runner logs every loss it keeps as configured.
# To keep a module as configured, give the config its own
# `nanguard = dict(module_swaps=[...])` with the entries it wants (a list
# replaces the included list as a whole).
_base_ = './safe_modules_settings.py'

runner_type = 'mmnanguard.NanGuardRunner'
