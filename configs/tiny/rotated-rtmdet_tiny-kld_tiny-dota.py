# Rotated RTMDet-tiny (the tiny config beside this one) with mmrotate's own
# Gaussian KLD regression loss, as the upstream KLD configs use it. On
# generated DOTA data its loss_bbox goes NaN by itself within the first few
# iterations (no fault is planted; at iteration 3 on a 2-core x86 CPU, the
# value itself, where other CPUs have seen the gradient go NaN first): the
# real, unplanted NaN that the diagnosis and the safe-modules include are
# tested on.
_base_ = './rotated-rtmdet_tiny_tiny-dota.py'

model = dict(
    bbox_head=dict(
        loss_bbox=dict(
            _delete_=True,
            type='GDLoss',
            loss_type='kld',
            fun='log1p',
            tau=1.0,
            loss_weight=2.0,
        )
    )
)
