# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmrotate's Gaussian distance losses with closed-form determinants.

``mmrotate.GDLoss`` builds ``Sigma = R S^2 R^T`` and calls ``Sigma.det()``.
For a thin box (zero width, clamped to 1e-7, or an aspect ratio of 1e6)
the determinant is a difference of two nearly equal products: in fp32 it
comes out zero or negative, ``log(det)`` is NaN and so are the loss ('kld',
'jd', 'kld_symmax', 'kld_symmin') and, for a thin *predicted* box, the
gradient. Here the determinant and the inverse come from the box
parameters, where they are products, never differences:
``det = (w h / 4)^2`` and ``Sigma^-1 = R S^-2 R^T``.
"""

from typing import Any, Callable, Dict, NamedTuple, Optional, Union

import torch
import torch.nn as nn
from torch import Tensor

from mmnanguard.registry import MODELS, register_shared

from .utils import safe_weight_reduce_loss

_REDUCTIONS = (None, 'none', 'mean', 'sum')
_FUNS = ('log1p', 'none', 'sqrt')
# Same bounds as mmrotate's xy_wh_r_2_xy_sigma / xy_stddev_pearson.
_WH_MIN, _WH_MAX = 1e-7, 1e7
_PEARSON_MAX = 1 - 1e-7


class Gaussian(NamedTuple):
    """A 2-D Gaussian with its inverse covariance and log-determinant."""

    xy: Tensor  # (N, 2)
    sigma: Tensor  # (N, 2, 2)
    sigma_inv: Tensor  # (N, 2, 2)
    log_det: Tensor  # (N, )


def xy_wh_r_2_gaussian(xywhr: Tensor) -> Gaussian:
    """Rotated boxes (N, 5) to Gaussians, w and h clamped to [1e-7, 1e7].

    Args:
        xywhr (Tensor): (N, 5) boxes.

    Returns:
        Gaussian: ``Sigma = R diag(w^2, h^2) R^T / 4`` and its exact inverse
        and log-determinant.
    """
    xy = xywhr[..., :2]
    half = xywhr[..., 2:4].clamp(min=_WH_MIN, max=_WH_MAX) / 2
    cos, sin = torch.cos(xywhr[..., 4]), torch.sin(xywhr[..., 4])
    rot = torch.stack((cos, -sin, sin, cos), dim=-1).view(-1, 2, 2)
    var = half.square().view(-1, 2)
    sigma = rot @ torch.diag_embed(var) @ rot.transpose(1, 2)
    sigma_inv = rot @ torch.diag_embed(1 / var) @ rot.transpose(1, 2)
    log_det = 2 * half.log().sum(-1).view(-1)
    return Gaussian(xy.reshape(-1, 2), sigma, sigma_inv, log_det)


def xy_stddev_pearson_2_gaussian(params: Tensor) -> Gaussian:
    """(x, y, std_x, std_y, pearson) (N, 5) to Gaussians.

    The correlation is clamped to ``±(1 - 1e-7)`` as upstream; the
    determinant is ``sx^2 sy^2 (1 - rho^2)``.
    """
    xy = params[..., :2].reshape(-1, 2)
    std = params[..., 2:4].reshape(-1, 2)
    rho = params[..., 4].clamp(min=-_PEARSON_MAX, max=_PEARSON_MAX)
    rho = rho.reshape(-1)
    covar = rho * std.prod(-1)
    var = std.square()
    sigma = torch.stack((var[:, 0], covar, covar, var[:, 1]), -1).view(
        -1, 2, 2
    )
    one_m_rho2 = (1 - rho) * (1 + rho)
    det = var.prod(-1) * one_m_rho2
    adj = torch.stack((var[:, 1], -covar, -covar, var[:, 0]), -1).view(
        -1, 2, 2
    )
    sigma_inv = adj / det.view(-1, 1, 1)
    log_det = var.log().sum(-1) + torch.log(one_m_rho2)
    return Gaussian(xy, sigma, sigma_inv, log_det)


def postprocess(
    distance: Tensor, fun: str = 'log1p', tau: float = 1.0
) -> Tensor:
    """Distance to loss, as mmrotate's ``postprocess``."""
    if fun == 'log1p':
        distance = torch.log1p(distance)
    elif fun == 'sqrt':
        distance = torch.sqrt(distance.clamp(1e-7))
    if tau >= 1.0:
        return 1 - 1 / (tau + distance)
    return distance


def _kld(p: Gaussian, t: Gaussian, alpha: float) -> Tensor:
    """KL(t || p) as in mmrotate (before ``sqrt`` and ``postprocess``)."""
    dxy = (p.xy - t.xy).unsqueeze(-1)
    xy_distance = 0.5 * (dxy.transpose(1, 2) @ p.sigma_inv @ dxy).view(-1)
    whr = 0.5 * (p.sigma_inv @ t.sigma).diagonal(dim1=-2, dim2=-1).sum(-1)
    whr = whr + 0.5 * (p.log_det - t.log_det) - 1
    return xy_distance / (alpha * alpha) + whr


def kld_loss(
    pred: Gaussian,
    target: Gaussian,
    fun: str = 'log1p',
    tau: float = 1.0,
    alpha: float = 1.0,
    sqrt: bool = True,
) -> Tensor:
    """Kullback-Leibler divergence loss (element-wise)."""
    distance = _kld(pred, target, alpha)
    if sqrt:
        distance = distance.clamp(1e-7).sqrt()
    return postprocess(distance, fun=fun, tau=tau)


def jd_loss(
    pred: Gaussian,
    target: Gaussian,
    fun: str = 'log1p',
    tau: float = 1.0,
    alpha: float = 1.0,
    sqrt: bool = True,
) -> Tensor:
    """Symmetric (Jeffreys) divergence loss (element-wise)."""
    jd = 0.5 * (_kld(pred, target, alpha) + _kld(target, pred, alpha))
    if sqrt:
        jd = jd.clamp(1e-7).sqrt()
    return postprocess(jd, fun=fun, tau=tau)


def _kld_sym(reduce: Callable[[Tensor, Tensor], Tensor]) -> Callable:
    def loss(
        pred: Gaussian,
        target: Gaussian,
        fun: str = 'log1p',
        tau: float = 1.0,
        alpha: float = 1.0,
        sqrt: bool = True,
    ) -> Tensor:
        d_pt, d_tp = _kld(pred, target, alpha), _kld(target, pred, alpha)
        if sqrt:
            d_pt, d_tp = d_pt.clamp(1e-7).sqrt(), d_tp.clamp(1e-7).sqrt()
        return postprocess(reduce(d_pt, d_tp), fun=fun, tau=tau)

    return loss


def gwd_loss(
    pred: Gaussian,
    target: Gaussian,
    fun: str = 'log1p',
    tau: float = 1.0,
    alpha: float = 1.0,
    normalize: bool = True,
) -> Tensor:
    """Gaussian Wasserstein distance loss (element-wise), as mmrotate."""
    xy_distance = (pred.xy - target.xy).square().sum(-1)
    whr = pred.sigma.diagonal(dim1=-2, dim2=-1).sum(-1)
    whr = whr + target.sigma.diagonal(dim1=-2, dim2=-1).sum(-1)
    t_tr = (pred.sigma @ target.sigma).diagonal(dim1=-2, dim2=-1).sum(-1)
    # the product of the two determinants, as upstream (each factor is
    # finite; exp of the summed log overflows first and its backward is
    # 0 * inf = nan)
    t_det = torch.exp(pred.log_det) * torch.exp(target.log_det)
    t_det_sqrt = t_det.clamp(1e-7).sqrt()
    whr = whr - 2 * (t_tr + 2 * t_det_sqrt).clamp(1e-7).sqrt()
    distance = (xy_distance + alpha * alpha * whr).clamp(1e-7).sqrt()
    if normalize:
        scale = 2 * t_det_sqrt.clamp(1e-7).sqrt().clamp(1e-7).sqrt()
        distance = distance / scale.clamp(1e-7)
    return postprocess(distance, fun=fun, tau=tau)


@register_shared(MODELS)
class SafeGDLoss(nn.Module):
    """Drop-in for mmrotate's ``GDLoss`` with finite loss and gradients for
    thin boxes.

    Same arguments and formulas; the determinants and inverse covariances
    are closed-form (see the module docstring) and everything runs in fp32
    with autocast disabled. Clamps, all as upstream: w and h to
    ``[1e-7, 1e7]``, the correlation of 'xy_stddev_pearson' to
    ``±(1 - 1e-7)``, distances to at least 1e-7 before ``sqrt``.

    Args:
        loss_type (str): 'kld', 'jd', 'kld_symmax', 'kld_symmin' or 'gwd'.
        representation (str): 'xy_wh_r' or 'xy_stddev_pearson'.
            Defaults to 'xy_wh_r'.
        fun (str): 'log1p', 'none' or 'sqrt'. Defaults to 'log1p'.
        tau (float): Defaults to 0.0 (as upstream's code; its docstring
            says 1.0).
        alpha (float): Weight of the centre term. Defaults to 1.0.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        **kwargs: Options of the loss function: ``sqrt`` (KLD family) or
            ``normalize`` ('gwd'); anything else raises.
    """

    BAG_GD_LOSS: Dict[str, Callable] = {
        'gwd': gwd_loss,
        'kld': kld_loss,
        'jd': jd_loss,
        'kld_symmax': _kld_sym(torch.max),
        'kld_symmin': _kld_sym(torch.min),
    }
    BAG_PREP: Dict[str, Callable] = {
        'xy_stddev_pearson': xy_stddev_pearson_2_gaussian,
        'xy_wh_r': xy_wh_r_2_gaussian,
    }

    def __init__(
        self,
        loss_type: str,
        representation: str = 'xy_wh_r',
        fun: str = 'log1p',
        tau: float = 0.0,
        alpha: float = 1.0,
        reduction: str = 'mean',
        loss_weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        checks = (
            ('loss_type', loss_type, tuple(self.BAG_GD_LOSS)),
            ('representation', representation, tuple(self.BAG_PREP)),
            ('fun', fun, _FUNS),
            ('reduction', reduction, _REDUCTIONS[1:]),
        )
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(
                    f'SafeGDLoss: {name} must be one of '
                    f'{allowed}, got {value!r}'
                )
        self.loss_type = loss_type
        self._check_options(kwargs)
        self.loss = self.BAG_GD_LOSS[loss_type]
        self.preprocess = self.BAG_PREP[representation]
        self.fun = fun
        self.tau = tau
        self.alpha = alpha
        self.reduction = reduction
        self.loss_weight = loss_weight
        self.kwargs = kwargs

    def _check_options(self, options: Dict[str, Any]) -> None:
        """Refuse loss-function options that ``loss_type`` does not take."""
        allowed = {'normalize'} if self.loss_type == 'gwd' else {'sqrt'}
        unknown = set(options) - allowed
        if unknown:
            raise ValueError(
                f'SafeGDLoss({self.loss_type!r}): unknown options '
                f'{sorted(unknown)}; allowed: {sorted(allowed)}'
            )

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Optional[Tensor] = None,
        avg_factor: Optional[Union[int, float]] = None,
        reduction_override: Optional[str] = None,
        **kwargs: Any,
    ) -> Tensor:
        """Compute the loss.

        Args:
            pred (Tensor): Predicted boxes (N, 5).
            target (Tensor): Target boxes (N, 5).
            weight (Tensor, optional): Weight (N, ) or (N, 5) (averaged
                over the last dimension, as upstream). Defaults to None.
            avg_factor (int | float, optional): Divisor of the mean.
                Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum'.
                Defaults to None.
            **kwargs: Options of the loss function for this call, over the
                constructor's (as upstream): ``sqrt`` or ``normalize``.

        Returns:
            Tensor: The loss (fp32).

        Raises:
            ValueError: For a bad ``reduction_override``, shape or option.
        """
        self._check_options(kwargs)
        options = dict(self.kwargs, **kwargs)
        if reduction_override not in _REDUCTIONS:
            raise ValueError(
                'SafeGDLoss: reduction_override must be None, '
                f"'none', 'mean' or 'sum', got {reduction_override!r}"
            )
        if pred.shape != target.shape or pred.size(-1) != 5:
            raise ValueError(
                'SafeGDLoss: pred and target must both have shape (N, 5), '
                f'got {tuple(pred.shape)} and {tuple(target.shape)}'
            )
        reduction = reduction_override or self.reduction
        if weight is not None and weight.dim() > 1:
            if weight.shape != pred.shape:
                raise ValueError(
                    'SafeGDLoss: a 2-D weight must have the shape of pred '
                    f'{tuple(pred.shape)}, got {tuple(weight.shape)}'
                )
            weight = weight.mean(-1)
        if (
            weight is not None
            and not torch.any(weight > 0)
            and reduction != 'none'
        ):
            keep = (weight > 0).unsqueeze(-1)
            return torch.where(keep, pred, torch.zeros_like(pred)).sum()
        with torch.autocast(device_type=pred.device.type, enabled=False):
            dtype = torch.promote_types(pred.dtype, torch.float32)
            loss = self.loss(
                self.preprocess(pred.to(dtype)),
                self.preprocess(target.to(dtype)),
                fun=self.fun,
                tau=self.tau,
                alpha=self.alpha,
                **options,
            )
            if weight is not None:
                weight = weight.to(dtype)
            loss = safe_weight_reduce_loss(loss, weight, reduction, avg_factor)
        return self.loss_weight * loss
