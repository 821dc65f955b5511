"""The fused optimizers. Each of torch.optim's five *is* its torch.optim twin (a subclass), so it takes the
same arguments with the same defaults and errors, keeps the same param_groups and state (per-param
state['step'], torch's state keys and dtypes) and exchanges state_dicts with torch both ways; only
step() is replaced by one fused pass over all parameters (see _base.py). FusedLion, FusedLAMB, FusedLARS,
FusedAdamP and FusedBertAdam take the arguments of their references (lion-pytorch's Lion, apex's FusedLAMB, apex's
LARC around torch.optim.SGD, clovaai's AdamP, torch_npu's NpuFusedBertAdam) in the same way.

Every class's signature (inspect.signature) lists its twin's parameters with the twin's defaults, then fusedopt's
own keyword-only options (_OPTIONS below; master_weights, flatten, max_grad_norm, accumulation_steps, ...), and
its docstring documents each option.
"""

from __future__ import annotations

import inspect
import math
from itertools import chain

from torch.optim.optimizer import required

import torch

from . import _C
from ._base import FusedOptimizerMixin, _grad_norm, _Skipped
from ._base import group_number as _f  # hyper-parameters may be 1-element tensors (lr, betas)
from ._tensors import route_error


class FusedSGD(FusedOptimizerMixin, torch.optim.SGD):
    _algorithm = "sgd"
    _counts_steps = False
    _takes_sparse = True
    _sparse_message = "fusedopt: FusedSGD does not support sparse gradients (strict=True)"

    def _hyper(self, g):
        return _C.SgdHyper(lr=_f(g, "lr"), momentum=_f(g, "momentum"), dampening=_f(g, "dampening"),
                           weight_decay=_f(g, "weight_decay"), nesterov=bool(g["nesterov"]),
                           maximize=bool(g["maximize"]))


class _AdamLike(FusedOptimizerMixin):
    _algorithm = "adam"

    def _hyper(self, g):
        return _C.AdamHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                            weight_decay=_f(g, "weight_decay"), amsgrad=bool(g["amsgrad"]),
                            maximize=bool(g["maximize"]),
                            decoupled_weight_decay=bool(g.get("decoupled_weight_decay", False)))


class FusedAdam(_AdamLike, torch.optim.Adam):
    _sparse_message = "Adam does not support sparse gradients, please consider SparseAdam instead"


class FusedAdamW(_AdamLike, torch.optim.AdamW):
    _sparse_message = FusedAdam._sparse_message  # torch 2.13's AdamW is an Adam and says the same


class FusedRMSprop(FusedOptimizerMixin, torch.optim.RMSprop):
    _algorithm = "rmsprop"
    _sparse_message = "RMSprop does not support sparse gradients"

    def _hyper(self, g):
        return _C.RmspropHyper(lr=_f(g, "lr"), alpha=_f(g, "alpha"), eps=_f(g, "eps"),
                               weight_decay=_f(g, "weight_decay"), momentum=_f(g, "momentum"),
                               centered=bool(g["centered"]), maximize=bool(g["maximize"]))


class FusedAdagrad(FusedOptimizerMixin, torch.optim.Adagrad):
    _algorithm = "adagrad"
    _takes_sparse = True
    _sparse_message = "fusedopt: FusedAdagrad does not support sparse gradients (strict=True)"

    def _hyper(self, g):
        return _C.AdagradHyper(lr=_f(g, "lr"), lr_decay=_f(g, "lr_decay"),
                               weight_decay=_f(g, "weight_decay"),
                               initial_accumulator_value=_f(g, "initial_accumulator_value"),
                               eps=_f(g, "eps"), maximize=bool(g["maximize"]))

    def _initial_state_value(self, key, group, p):
        # torch 2.13 fills a new 'sum' with the constructor's value, whatever the group says.
        return _f(self.defaults, "initial_accumulator_value") if key == "sum" else 0.0


class _LionGroups(torch.optim.Optimizer):
    """lion-pytorch's Lion constructor (arguments, defaults, param groups); FusedLion supplies the step."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0,
                 use_triton: bool = False, decoupled_weight_decay: bool = False):
        # lion-pytorch asserts these (AssertionError, no message); ours say what is wrong.
        if not lr > 0.0:
            raise ValueError(f"Invalid learning rate: {lr} (Lion requires lr > 0)")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta <= 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta} (must be in [0, 1])")
        if use_triton:
            raise ValueError("fusedopt: FusedLion runs on the CPU engine; use_triton=True is lion-pytorch's GPU kernel")
        self._init_lr = lr
        self.decoupled_wd = decoupled_weight_decay
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))


class FusedLion(FusedOptimizerMixin, _LionGroups):
    """Lion (Chen et al. 2023) with lion-pytorch's arguments, defaults, state ('exp_avg' only, no 'step') and
    update, fused. With decoupled_weight_decay=True the weight decay is divided by the constructor's lr, as
    lion-pytorch does."""

    _algorithm = "lion"
    _counts_steps = False
    _sparse_message = "fusedopt: FusedLion does not support sparse gradients"

    def _hyper(self, g):
        wd = _f(g, "weight_decay")
        if self.decoupled_wd:
            wd /= self._init_lr
        return _C.LionHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), weight_decay=wd,
                            maximize=bool(g.get("maximize", False)))

    def _reference_step(self):
        """lion-pytorch's update_fn, op for op, for the params the engine cannot take."""
        for g in self.param_groups:
            h = self._hyper(g)
            for p in g["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if h.maximize else p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1.0 - h.lr * h.weight_decay)
                p.add_(m.clone().mul_(h.beta1).add(grad, alpha=1.0 - h.beta1).sign_(), alpha=-h.lr)
                m.mul_(h.beta2).add_(grad, alpha=1.0 - h.beta2)


class _LambGroups(torch.optim.Optimizer):
    """apex FusedLAMB's constructor (arguments, defaults, checks, param groups); FusedLAMB supplies the step."""

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, amsgrad: bool = False, adam_w_mode: bool = True,
                 grad_averaging: bool = True, set_grad_none: bool = True, max_grad_norm: float = 1.0,
                 use_nvlamb: bool = False):
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        grad_averaging=grad_averaging, adam_w_mode=adam_w_mode, max_grad_norm=max_grad_norm,
                        use_nvlamb=use_nvlamb)
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none


class FusedLAMB(FusedOptimizerMixin, _LambGroups):
    """LAMB with apex FusedLAMB's arguments, defaults and formulas, fused: each step runs one pass for the
    global gradient norm (clipping by max_grad_norm, apex's rule: divide by norm/max_grad_norm when above it;
    here multiplied by max_grad_norm/norm), one for every tensor's ‖p‖ and ‖update‖ (the trust ratio), and
    the update. Differences from apex: the step count is torch's per-param state['step'] (apex keeps one
    group['step']), and max_grad_norm is the constructor's (as apex reads it from the defaults)."""

    _algorithm = "lamb"
    _clip_rule = 1  # apex's max_grad_norm, not clip_grad_norm_'s max/(norm + 1e-6)
    _sparse_message = "FusedLAMB does not support sparse gradients, please consider SparseAdam instead"

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, amsgrad: bool = False, adam_w_mode: bool = True,
                 grad_averaging: bool = True, set_grad_none: bool = True, max_grad_norm: float = 1.0,
                 use_nvlamb: bool = False, **kwargs):
        if "norm_type" in kwargs:
            raise TypeError("FusedLAMB clips by the L2 norm only (apex's max_grad_norm); norm_type is not taken")
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                         grad_averaging=grad_averaging, set_grad_none=set_grad_none, use_nvlamb=use_nvlamb,
                         max_grad_norm=max_grad_norm, **kwargs)
        # The mixin took max_grad_norm; the groups carry it too, as apex's do (the step reads only this one).
        self.defaults["max_grad_norm"] = max_grad_norm
        for group in self.param_groups:
            group["max_grad_norm"] = max_grad_norm

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def _hyper(self, g):
        return _C.LambHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                            weight_decay=_f(g, "weight_decay"), bias_correction=bool(g["bias_correction"]),
                            adam_w_mode=bool(g["adam_w_mode"]), grad_averaging=bool(g["grad_averaging"]),
                            use_nvlamb=bool(g["use_nvlamb"]))

    def _reference_step(self):
        """apex FusedLAMB's per-tensor update in torch ops (as tools/lamb_reference.py), for the
        params the engine cannot take; the step has clipped their gradients already."""
        for g in self.param_groups:
            h = self._hyper(g)
            b3 = 1.0 - h.beta1 if h.grad_averaging else 1.0
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                t = state["step"].item()
                bc1, bc2 = (1.0 - h.beta1**t, 1.0 - h.beta2**t) if h.bias_correction else (1.0, 1.0)
                grad, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
                if not h.adam_w_mode and h.weight_decay != 0.0:
                    grad = grad + h.weight_decay * p
                m.mul_(h.beta1).add_(grad, alpha=b3)
                v.mul_(h.beta2).addcmul_(grad, grad, value=1.0 - h.beta2)
                u = (m / bc1) / ((v / bc2).sqrt() + h.eps)
                if h.adam_w_mode and h.weight_decay != 0.0:
                    u.add_(p, alpha=h.weight_decay)
                pn, un = float(p.norm()), float(u.norm())
                trust = (h.use_nvlamb or h.weight_decay != 0.0) and pn != 0.0 and un != 0.0
                p.add_(u, alpha=-(h.lr * pn / un if trust else h.lr))


class FusedAdamax(FusedOptimizerMixin, torch.optim.Adamax):
    """torch.optim.Adamax, fused: exp_avg.lerp_(g, 1 - beta1), exp_inf = max(beta2 * exp_inf, |g| + eps),
    p -= lr / (1 - beta1**step) * exp_avg / exp_inf (torch's single-tensor path, bit for bit)."""

    _algorithm = "adamax"
    _sparse_message = "Adamax does not support sparse gradients"

    def _hyper(self, g):
        return _C.AdamaxHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                              weight_decay=_f(g, "weight_decay"), maximize=bool(g["maximize"]))


class FusedAdadelta(FusedOptimizerMixin, torch.optim.Adadelta):
    """torch.optim.Adadelta, fused: square_avg = rho * square_avg + (1 - rho) * g², delta = sqrt(acc_delta + eps)
    / sqrt(square_avg + eps) * g, acc_delta = rho * acc_delta + (1 - rho) * delta², p -= lr * delta (torch's
    single-tensor order; an IEEE sqrt where torch's CPU wheel rounds some values one ulp off)."""

    _algorithm = "adadelta"
    _sparse_message = "Adadelta does not support sparse gradients"

    def _hyper(self, g):
        return _C.AdadeltaHyper(lr=_f(g, "lr"), rho=_f(g, "rho"), eps=_f(g, "eps"), weight_decay=_f(g, "weight_decay"),
                                maximize=bool(g["maximize"]))


class FusedRAdam(FusedOptimizerMixin, torch.optim.RAdam):
    """torch.optim.RAdam, fused: Adam's moments; while rho_t <= 5 (steps 1-5 for beta2 near 1) the step is
    p -= lr * exp_avg / bias_correction1, later the rectified adaptive step. The branch depends only on the
    step, so the engine takes it per tensor. decoupled_weight_decay=True decays as AdamW."""

    _algorithm = "radam"
    _sparse_message = "RAdam does not support sparse gradients"

    def _hyper(self, g):
        return _C.RadamHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                             weight_decay=_f(g, "weight_decay"),
                             decoupled_weight_decay=bool(g.get("decoupled_weight_decay", False)),
                             maximize=bool(g["maximize"]))


class FusedNAdam(FusedOptimizerMixin, torch.optim.NAdam):
    """torch.optim.NAdam, fused: Adam's moments with Nesterov momentum whose coefficient mu_t warms up with
    momentum_decay; each param's state['mu_product'] (a 0-d f32 tensor, as torch keeps it) is advanced by the
    engine in f32 and read for the step's two coefficients. decoupled_weight_decay=True decays as AdamW."""

    _algorithm = "nadam"
    _sparse_message = "NAdam does not support sparse gradients"

    def _hyper(self, g):
        return _C.NadamHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                             weight_decay=_f(g, "weight_decay"), momentum_decay=_f(g, "momentum_decay"),
                             decoupled_weight_decay=bool(g.get("decoupled_weight_decay", False)),
                             maximize=bool(g["maximize"]))


class _RMSpropTFGroups(torch.optim.Optimizer):
    """torch_npu NpuFusedRMSpropTF's constructor (arguments, defaults, checks and their texts, param groups);
    FusedRMSpropTF supplies the step."""

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.9, eps: float = 1e-10, weight_decay: float = 0,
                 momentum: float = 0.0, centered: bool = False, decoupled_decay: bool = False,
                 lr_in_momentum: bool = True):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, decoupled_decay=decoupled_decay,
                                      lr_in_momentum=lr_in_momentum))


class FusedRMSpropTF(FusedOptimizerMixin, _RMSpropTFGroups):
    """RMSpropTF (TensorFlow's RMSprop) with torch_npu NpuFusedRMSpropTF's arguments, defaults and formulas (the
    old timm RMSpropTF), fused: eps inside the sqrt, square_avg starting at ones, sq += (1 - alpha)(g² - sq);
    weight decay added to the gradient, or with decoupled_decay p *= 1 - weight_decay (not scaled by lr, as
    the NPU class and old timm; current timm uses 1 - lr * weight_decay); momentum with lr folded into the
    buffer (lr_in_momentum=True) or scaling the step. State: step (a float32 0-d tensor, as torch.optim's;
    the NPU keeps an int), square_avg, momentum_buffer (momentum > 0), grad_avg (centered)."""

    _algorithm = "rmsproptf"
    _sparse_message = "fusedopt: FusedRMSpropTF does not support sparse gradients"

    def _hyper(self, g):
        return _C.RmsproptfHyper(lr=_f(g, "lr"), alpha=_f(g, "alpha"), eps=_f(g, "eps"),
                                 weight_decay=_f(g, "weight_decay"), momentum=_f(g, "momentum"),
                                 centered=bool(g["centered"]), decoupled_decay=bool(g["decoupled_decay"]),
                                 lr_in_momentum=bool(g["lr_in_momentum"]))

    def _initial_state_value(self, key, group, p):
        return 1.0 if key == "square_avg" else 0.0  # the reference starts square_avg at ones

    def _reference_step(self):
        """NpuFusedRMSpropTF's per-tensor update in torch ops (as tools/rmsproptf_reference.py), for the params
        the engine cannot take."""
        for g in self.param_groups:
            h = self._hyper(g)
            for p in g["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0)
                if "square_avg" not in state:
                    state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                if h.momentum > 0.0 and "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if h.centered and "grad_avg" not in state:
                    state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                sq = state["square_avg"]
                if h.weight_decay != 0.0:
                    if h.decoupled_decay:
                        p.add_(p, alpha=-h.weight_decay)
                    else:
                        grad = grad.add(p, alpha=h.weight_decay)
                sq.add_(grad.pow(2) - sq, alpha=1.0 - h.alpha)
                if h.centered:
                    ga = state["grad_avg"]
                    ga.add_(grad - ga, alpha=1.0 - h.alpha)
                    avg = sq.addcmul(ga, ga, value=-1).add(h.eps).sqrt_()
                else:
                    avg = sq.add(h.eps).sqrt_()
                if h.momentum > 0.0:
                    buf = state["momentum_buffer"]
                    buf.mul_(h.momentum)
                    if h.lr_in_momentum:
                        buf.addcdiv_(grad, avg, value=h.lr)
                        p.add_(-buf)
                    else:
                        buf.addcdiv_(grad, avg)
                        p.add_(buf, alpha=-h.lr)
                else:
                    p.addcdiv_(grad, avg, value=-h.lr)


class FusedASGD(FusedOptimizerMixin, torch.optim.ASGD):
    """torch.optim.ASGD, fused: p = p * (1 - lambd * eta) - eta * g, then ax = p until averaging starts (mu == 1)
    and ax += mu * (p - ax) after; each param's state['eta'] and state['mu'] (0-d f32 tensors, as torch keeps
    them) are read by the step as the previous one left them and advanced by the engine: eta = lr / (1 + lambd
    * lr * step) ** alpha and mu = 1 / max(1, step - t0), in double, rounded to f32 as torch does (torch's
    single-tensor path, bit for bit)."""

    _algorithm = "asgd"
    _sparse_message = "ASGD does not support sparse gradients"

    def _hyper(self, g):
        return _C.AsgdHyper(lr=_f(g, "lr"), lambd=_f(g, "lambd"), alpha=_f(g, "alpha"), t0=_f(g, "t0"),
                            weight_decay=_f(g, "weight_decay"), maximize=bool(g["maximize"]))


class _LarsGroups(torch.optim.Optimizer):
    """LARC(SGD(...))'s constructor as one (arguments, defaults, checks, param groups); FusedLARS supplies the step.
    SGD's arguments come first with torch.optim.SGD's defaults and checks (texts included), then LARC's, per group."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, trust_coefficient: float = 0.02,
                 clip: bool = True, eps: float = 1e-8):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        # apex LARC checks nothing; a negative trust coefficient or eps would turn the step uphill.
        if not trust_coefficient >= 0.0:
            raise ValueError(f"Invalid trust_coefficient value: {trust_coefficient}")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        trust_coefficient=trust_coefficient, clip=clip, eps=eps)
        super().__init__(params, defaults)


class FusedLARS(FusedOptimizerMixin, _LarsGroups):
    """LARS with NVIDIA apex LARC's semantics around torch.optim.SGD, fused: one pass for every tensor's ‖p‖ and
    ‖g‖, then SGD's momentum step on g scaled by LARC's trust ratio tc·‖p‖/(‖g‖ + ‖p‖·wd + eps) with the weight
    decay added first, where both norms are non-zero (else g as it is, without decay). clip=True (LARC's default)
    uses min(ratio / lr, 1), an effective lr of min(local lr, lr); clip=False scales lr by the ratio. The state is
    torch.optim.SGD's (momentum_buffer, no step). Unlike LARC, .grad is left as it is (LARC overwrites it with the
    scaled gradient). Reference: tools/lars_reference.py."""

    _algorithm = "lars"
    _counts_steps = False
    _sparse_message = "fusedopt: FusedLARS does not support sparse gradients"

    def _hyper(self, g):
        return _C.LarsHyper(lr=_f(g, "lr"), momentum=_f(g, "momentum"), dampening=_f(g, "dampening"),
                            weight_decay=_f(g, "weight_decay"), trust_coefficient=_f(g, "trust_coefficient"),
                            eps=_f(g, "eps"), nesterov=bool(g["nesterov"]), clip=bool(g["clip"]))

    def _reference_step(self):
        """LARC's scaling and torch.optim.SGD's step in torch ops (as tools/lars_reference.py), for the params the
        engine cannot take; the norms in double, rounded to the param's (real) dtype."""
        for g in self.param_groups:
            h = self._hyper(g)
            for p in g["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                pn, gn = _exact_norm(p), _exact_norm(d)
                if pn != 0 and gn != 0:
                    ratio = h.trust_coefficient * pn / (gn + pn * h.weight_decay + h.eps)
                    if h.clip:
                        ratio = min(ratio / h.lr, 1)
                    d = d + h.weight_decay * p
                    d *= ratio
                if h.momentum != 0:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = torch.clone(d).detach()
                        state["momentum_buffer"] = buf
                    else:
                        buf.mul_(h.momentum).add_(d, alpha=1 - h.dampening)
                    d = d.add(buf, alpha=h.momentum) if h.nesterov else buf
                p.add_(d, alpha=-h.lr)


def _exact_norm(t: torch.Tensor) -> torch.Tensor:
    """‖t‖ computed in double (complex: of its real view), rounded once to t's real dtype: a 0-d tensor."""
    real = torch.view_as_real(t) if t.is_complex() else t
    return torch.linalg.vector_norm(real, dtype=torch.float64).to(real.dtype)


class FusedRprop(FusedOptimizerMixin, torch.optim.Rprop):
    """torch.optim.Rprop, fused: per element, f = sign(g * prev) becomes etaplus (> 0), etaminus (< 0) or 1 (== 0),
    step_size = clamp(step_size * f, *step_sizes), g = 0 where f == etaminus, p -= sign(g) * step_size, prev = g
    (torch's single-tensor path, bit for bit). A new step_size starts at its group's lr (lr + lr*1j for a
    complex param, as torch)."""

    _algorithm = "rprop"
    _sparse_message = "Rprop does not support sparse gradients"

    def _hyper(self, g):
        return _C.RpropHyper(lr=_f(g, "lr"), etaminus=_f(g, "etas", 0), etaplus=_f(g, "etas", 1),
                             step_size_min=_f(g, "step_sizes", 0), step_size_max=_f(g, "step_sizes", 1),
                             maximize=bool(g["maximize"]))

    def _initial_state_value(self, key, group, p):
        # torch: full_like(grad, lr), or complex(lr, lr) for a complex param
        if key != "step_size":
            return 0.0
        lr = _f(group, "lr")
        return complex(lr, lr) if p.is_complex() else lr
class _AdampGroups(torch.optim.Optimizer):
    """clovaai AdamP's constructor (arguments, defaults, param groups), with torch.optim.Adam's checks (clovaai
    checks nothing); FusedAdamP supplies the step."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 delta: float = 0.1, wd_ratio: float = 0.1, nesterov: bool = False):
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not delta >= 0.0:
            raise ValueError(f"Invalid delta value: {delta}")
        if not (wd_ratio >= 0.0 and math.isfinite(wd_ratio)):
            raise ValueError(f"Invalid wd_ratio value: {wd_ratio}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta, wd_ratio=wd_ratio,
                        nesterov=nesterov)
        super().__init__(params, defaults)


class FusedAdamP(FusedOptimizerMixin, _AdampGroups):
    """AdamP (Heo et al. 2021) with clovaai's adamp.AdamP arguments, defaults and update (the one torch_npu's
    NpuFusedAdamP ports), fused: Adam's moments and u = m / (sqrt(v) / sqrt(1 - b2^t) + eps) (Nesterov: b1 m +
    (1 - b1) g over the same denominator); for each param of more than one dimension, when the raw gradient is
    nearly orthogonal to the param (max over the channel rows of |cos(g_r, p_r)| < delta / sqrt(row length), or
    else over the whole tensor), u loses its radial part per row (u -= p_n (p_n . u), p_n = p / (|p_r| + eps)) and
    the decoupled decay p *= 1 - lr wd is scaled by wd_ratio; then p -= lr / (1 - b1^t) u. One reduction pass gives
    every channel row's sums; the update pass projects, decays and steps. state['step'] is a float32 tensor, as
    torch.optim keeps it (clovaai: an int; both load). Params whose channel rows are not contiguous in memory (a
    transposed matrix) take the reference's step."""

    _algorithm = "adamp"
    _sparse_message = "fusedopt: FusedAdamP does not support sparse gradients"

    def _hyper(self, g):
        return _C.AdampHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                             weight_decay=_f(g, "weight_decay"), delta=_f(g, "delta"), wd_ratio=_f(g, "wd_ratio"),
                             nesterov=bool(g["nesterov"]))

    def _route(self, p, g, gi, j):
        route = super()._route(p, g, gi, j)
        if route is None and p.dim() > 1 and p.shape[0] > 1 and p.stride(0) * p.shape[0] != p.numel():
            reason = (f"its channel rows (dimension 0, of shape {tuple(p.shape)} and strides {p.stride()}) are not "
                      "contiguous in memory")
            if self._strict:
                raise route_error((ValueError, reason), self._name(gi, j))
            return reason
        return route

    def _reference_step(self):
        """clovaai's AdamP.step in torch ops (as tools/adamp_reference.py), for the params the engine cannot take."""
        for group in self.param_groups:
            beta1, beta2 = _f(group, "betas", 0), _f(group, "betas", 1)
            lr, eps, wd = _f(group, "lr"), _f(group, "eps"), _f(group, "weight_decay")
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] += 1
                t = int(state["step"].item())
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                if group["nesterov"]:
                    perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
                else:
                    perturb = exp_avg / denom
                wd_ratio = 1
                if p.dim() > 1:
                    expand = [-1] + [1] * (p.dim() - 1)
                    for rows in (p.shape[0], 1):
                        cos = torch.nn.functional.cosine_similarity(grad.reshape(rows, -1), p.reshape(rows, -1), dim=1,
                                                                    eps=eps).abs_()
                        if cos.max() < _f(group, "delta") / math.sqrt(p.numel() // rows):
                            p_n = p / p.reshape(rows, -1).norm(dim=1).view(expand).add_(eps)
                            perturb -= p_n * (p_n * perturb).reshape(rows, -1).sum(dim=1).view(expand)
                            wd_ratio = _f(group, "wd_ratio")
                            break
                if wd > 0:
                    p.mul_(1 - lr * wd * wd_ratio)
                p.add_(perturb, alpha=-(lr / (1 - beta1**t)))


# NpuFusedBertAdam's schedule names and the engine's codes (BertAdamSchedule in include/fusedopt/hyper.h).
_BERT_SCHEDULES = {"warmup_linear": 0, "warmup_constant": 1, "warmup_cosine": 2, "warmup_poly": 3}


def _bert_schedule_factor(schedule: str, x: float, warmup: float) -> float:
    """The factor of lr at progress x = steps before / t_total (src/algos/bert_adam.h says where this differs
    from NpuFusedBertAdam: warmup -1 counts as 0, cosine works, poly is 0 past x = 1)."""
    warmup = max(warmup, 0.0)
    if x < warmup:
        return x / warmup
    if schedule == "warmup_constant":
        return 1.0
    if schedule == "warmup_cosine":
        return 0.5 * (1.0 + math.cos(math.pi * x))
    if schedule == "warmup_poly":
        return (1.0 - x) ** 0.5 if x < 1.0 else 0.0
    return max((x - 1.0) / (warmup - 1.0), 0.0)


class _BertAdamGroups(torch.optim.Optimizer):
    """torch_npu NpuFusedBertAdam's constructor (arguments, defaults, checks and their texts, param groups; HF
    pytorch-pretrained-bert's BertAdam has the same); FusedBertAdam supplies the step."""

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if (warmup < 0.0 and warmup != -1) or warmup >= 1.0:
            raise ValueError(f"Invalid warmup: {warmup}")
        if schedule not in _BERT_SCHEDULES:
            raise ValueError(f"Invalid schedule parameter: {schedule}")
        if b1 < 0.0 or b1 >= 1.0:
            raise ValueError(f"Invalid b1 parameter: {b1}")
        if b2 < 0.0 or b2 >= 1.0:
            raise ValueError(f"Invalid b2 parameter: {b2}")
        if e < 0.0:
            raise ValueError(f"Invalid epsilon value: {e}")
        # The reference leaves t_total unchecked: 0 divides by zero at the first step.
        if not (t_total == -1 or t_total > 0):
            raise ValueError(f"Invalid t_total: {t_total} (must be -1 or > 0)")
        defaults = dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        self.max_grad_norm = max_grad_norm
        super().__init__(params, defaults)


class FusedBertAdam(FusedOptimizerMixin, _BertAdamGroups):
    """BertAdam (HF pytorch-pretrained-bert's, as torch_npu's NpuFusedBertAdam runs it) with the reference's
    arguments, defaults and update, fused: Adam's moments without bias correction, u = m / (sqrt(v) + e), plus
    weight_decay * p when weight_decay > 0, p -= lr_s * u with lr_s = lr * schedule(s / t_total, warmup) (s: the
    param's steps before this one; lr when t_total is -1).

    max_grad_norm is the reference's clipping, not the mixin's global one: with max_grad_norm > 0 the gradients of
    each (param group, dtype) -- the flat buffers NpuFusedBertAdam clips one by one -- are scaled by
    max_grad_norm / (||g|| + 1e-6) of that buffer when it is below 1, before the moments. Global clipping
    (torch.nn.utils.clip_grad_norm_ over every param, the max_grad_norm= of the other fused classes) scales all
    gradients by one factor from one norm; here each buffer has its own norm and factor, so a group whose
    gradients are small is not shrunk because another's are large. HF's BertAdam clips each param by its own
    norm: the same when every group holds one param. One reduction pass gives every tensor's sum of g^2, the
    update pass applies each buffer's factor as it reads the gradient: .grad is left as it is (the reference
    writes the clipped gradient into it). Each group's max_grad_norm is the one used (HF; the NPU class reads the
    constructor's for all groups: the same unless a group sets its own).

    Where the reference is broken this does what it means: state['step'] is incremented per param (a float32
    tensor, as torch.optim keeps it) and is the step the schedule reads, so a resumed run continues its schedule
    (the NPU class never increments it); warmup_cosine uses math.cos (the NPU class raises TypeError);
    warmup -1 counts as 0 (HF), and warmup_poly is 0 past t_total. A step in which some param must take the
    reference's own step (float64, strided, another device) runs it for every param, so that each buffer is
    clipped by its whole norm. Reference: tools/bert_adam_reference.py."""

    _algorithm = "bert_adam"
    _sparse_message = "Adam does not support sparse gradients, please consider SparseAdam instead"

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0, **kwargs):
        if "norm_type" in kwargs:
            raise TypeError("FusedBertAdam clips by the L2 norm only (the reference's max_grad_norm); norm_type is "
                            "not taken")
        # Positional: max_grad_norm goes to the reference's constructor, not to the mixin's global clipping.
        super().__init__(params, lr, warmup, t_total, schedule, b1, b2, e, weight_decay, max_grad_norm, **kwargs)

    def _hyper(self, g):
        schedule = _BERT_SCHEDULES.get(g["schedule"]) if isinstance(g["schedule"], str) else None
        if schedule is None:
            raise ValueError(f"Invalid schedule parameter: {g['schedule']}")
        return _C.BertAdamHyper(lr=_f(g, "lr"), warmup=_f(g, "warmup"), t_total=_f(g, "t_total"), schedule=schedule,
                                b1=_f(g, "b1"), b2=_f(g, "b2"), e=_f(g, "e"), weight_decay=_f(g, "weight_decay"),
                                max_grad_norm=_f(g, "max_grad_norm"))

    def _step_with_torch(self, packed, grad_scale, found_out):
        """Some params take the reference's step: every param does, in this step (see the class docstring)."""
        self._warn_routed(packed.routed)
        self.last_grad_norm = None
        params = list(dict.fromkeys(chain(packed.params, packed.routed)))
        if found_out is not None and not math.isfinite(_grad_norm([p.grad for p in params], 2)):
            found_out.fill_(1.0)
            raise _Skipped
        # The engine's checks of the hyper-parameters, before any update.
        self._check_hypers(packed.hypers)
        if grad_scale == 1.0:
            self._torch_step({p: p.grad for p in params})
        else:  # as torch's GradScaler.unscale_ multiplies, by an f32 factor
            factor = torch.tensor(grad_scale, dtype=torch.float32)
            self._torch_step({p: p.grad * factor.to(p.grad.device) for p in params})

    def _micro_batch(self):
        out = super()._micro_batch()
        routed = out[4]
        if routed and any(_f(g, "max_grad_norm") > 0 for g in self.param_groups):
            raise ValueError("fusedopt: FusedBertAdam's max_grad_norm with accumulation_steps > 1 needs every "
                             f"parameter on the fused path; {'; '.join(routed.values())}")
        return out

    def _reference_step(self):
        """NpuFusedBertAdam's step in torch ops (as tools/bert_adam_reference.py), for the params the engine cannot
        take: per (group, dtype) the gradient norm (in double) and its clip factor, then each param's update; the
        clipped gradient is a new tensor (.grad is left as it is). A param with an f32 master copy is updated
        through it."""
        for group in self.param_groups:
            h = self._hyper(group)
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for p in dict.fromkeys(group["params"]):
                if p.grad is not None:
                    by_dtype.setdefault(p.dtype, []).append(p)
            for params in by_dtype.values():
                clip = None
                if h.max_grad_norm > 0:
                    norms = torch.stack([torch.linalg.vector_norm(p.grad, dtype=torch.float64).cpu() for p in params])
                    coef = h.max_grad_norm / (torch.linalg.vector_norm(norms).float() + 1e-6)
                    if coef < 1.0:
                        clip = coef
                for p in params:
                    self._bert_update(p, h, group["schedule"], p.grad if clip is None else p.grad * clip.to(p.device))

    def _bert_update(self, p, h, schedule, grad):
        state = self.state[p]
        target = state.get("master_param", p)
        if "step" not in state:
            state["step"] = torch.tensor(0.0)
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in state:
                state[key] = torch.zeros_like(target, memory_format=torch.preserve_format)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        g = grad.to(m.dtype)
        m.mul_(h.b1).add_(g, alpha=1 - h.b1)
        v.mul_(h.b2).addcmul_(g, g, value=1 - h.b2)
        update = m / (v.sqrt() + h.e)
        if h.weight_decay > 0.0:
            update += h.weight_decay * target
        before = int(state["step"].item())
        lr = h.lr if h.t_total == -1 else h.lr * _bert_schedule_factor(schedule, before / h.t_total, h.warmup)
        target.add_(-(lr * update).to(target.dtype))
        if target is not p:
            p.copy_(target)
        state["step"] += 1


class FusedAdafactor(FusedOptimizerMixin, torch.optim.Adafactor):
    """torch.optim.Adafactor (torch 2.13's _single_tensor_adafactor), fused: for a param of more than one dimension
    the second moment is factored over its last two dimensions (leading ones are a batch): state['row_var'] of
    shape [..., R, 1] and state['col_var'] [..., 1, C], lerped towards the row and column means of g^2 with
    weight t**beta2_decay; V = row_var @ col_var / max(mean(row_var), eps1). A vector keeps state['variance']
    like the param. U = g / sqrt(max(V, eps1^2)); p *= 1 - lr * weight_decay; p -= alpha / max(1, RMS(U) / d) * U
    with alpha = max(eps2, RMS(p)) * min(lr, 1 / sqrt(t)) (RMS of p before the decay). eps = (eps1, eps2) with
    eps1 None: finfo(dtype).eps of the group's first param with a gradient, as torch. The engine runs three
    passes over a factored param (Sigma p^2 with the row and column sums of g^2; ||U||^2 from the new factors; the
    update), two over a vector, every sum in double in a fixed order: results match torch to about 1e-7
    relative, not bit for bit (torch.norm sums in an order of its own). Params of no elements, complex params
    and params whose last two dimensions are not row-major contiguous take torch's step (which raises for the
    first two, as torch.optim.Adafactor does). stochastic_rounding=True rounds 16-bit stores stochastically: the
    param without master copy and variance in the update kernel, row_var and col_var where the step stores them
    (noise keyed on seed, step, the element's or factor's index and the state, docs/numerics.md). flatten=True
    puts params, grads and variance into flat buffers; row_var and col_var stay tensors of their own, so the
    state_dict keeps torch's keys, shapes and dtypes."""

    _algorithm = "adafactor"
    _sparse_message = "Adafactor does not support sparse gradients"

    def _hyper(self, g):
        eps2 = _f(g, "eps", 1)  # (first: it checks that eps holds two values)
        eps1 = g["eps"][0]
        if eps1 is None:  # torch: finfo(param.dtype).eps of the first param with a grad (in the loop)
            dtype = next((p.dtype for p in g["params"] if p.grad is not None), torch.float32)
            eps1 = torch.finfo(dtype).eps
        return _C.AdafactorHyper(lr=_f(g, "lr"), beta2_decay=_f(g, "beta2_decay"), eps1=float(eps1),
                                 eps2=eps2, d=_f(g, "d"), weight_decay=_f(g, "weight_decay"),
                                 maximize=bool(g["maximize"]))

    def _needed_states(self, p, needed):
        return (True, True, False) if p.dim() > 1 else (False, False, True)

    def _state_shape(self, p, key):
        if key == "row_var":
            return tuple(p.shape[:-1]) + (1,)
        if key == "col_var":
            return tuple(p.shape[:-2]) + (1, p.shape[-1])
        return None

    def _route(self, p, g, gi, j):
        if p.is_complex():
            raise RuntimeError("Adafactor does not support complex parameters")
        route = super()._route(p, g, gi, j)
        if route is not None:
            return route
        reason = None
        if p.numel() == 0:
            reason = "it has no elements (torch's step divides by numel)"
        elif p.dim() > 1 and not p.is_contiguous():
            reason = f"its last two dimensions are not row-major contiguous (shape {tuple(p.shape)}, strides {p.stride()})"
        if reason is not None and self._strict:
            raise route_error((ValueError, reason), self._name(gi, j))
        return reason


# fusedopt's own keyword-only options (FusedOptimizerMixin.__init__), as every class's docstring documents them.
_OPTIONS = {
    "master_weights": "fp16/bf16 params keep an f32 master copy (state['master_param']) and f32 optimizer "
                      "states; the param receives the rounded update. False: 16-bit params and states are "
                      "updated in their own dtype, as torch does.",
    "flatten": "params, grads and states of each dtype live in one flat buffer (see flat_grads()).",
    "max_grad_norm": "clip the global gradient norm to this inside the step (torch's clip_grad_norm_ "
                     "coefficient, folded into the update: no pass writes the gradients); a step whose gradients "
                     "hold Inf/NaN is skipped, and `last_grad_norm` is the norm. None: no clipping.",
    "norm_type": "the norm of max_grad_norm: 1, 2 or inf.",
    "accumulation_steps": "step() adds the gradients (any dtype, unscaled by a GradScaler) into f32 accumulators "
                          "and updates every k-th call with their mean: one large batch. A micro-batch with "
                          "Inf/NaN gradients skips its whole window.",
    "state_dtype": "dtype of the optimizer states (e.g. torch.bfloat16: half the memory of f32 moments); None: "
                   "the param's dtype, or f32 with master_weights.",
    "stochastic_rounding": "16-bit states, and 16-bit params without a master copy (pure bf16 training), are "
                           "rounded stochastically, keyed on (seed, step, element index): unbiased, "
                           "reproducible, independent of threads.",
    "seed": "the seed of stochastic_rounding's noise, an int in [0, 2**64).",
    "strict": "params or steps the engine cannot take (another device or dtype, no storage of their own such as "
              "DTensors, sparse gradients, differentiable=True) are errors, instead of taking the reference's own "
              "(unfused) step with a warning.",
}


def _twin(cls: type) -> type:
    """The class whose constructor cls takes: the first of its bases that is not fused (torch.optim.AdamW for
    FusedAdamW, _LambGroups for FusedLAMB)."""
    return next(c for c in cls.__mro__ if not issubclass(c, FusedOptimizerMixin))


def _publish_signature(cls: type) -> None:
    """Gives cls an __init__ whose signature is its twin's parameters, with the twin's defaults, then fusedopt's
    keyword-only options (those the twin does not take itself; norm_type goes with the mixin's max_grad_norm), and
    a docstring documenting each option, so that tools reading signatures (timm's optimizer factory, Lightning
    CLI, jsonargparse, Hydra) see them. The __init__ calls the one cls had, as before; first it checks that each
    tuple hyper-parameter (betas, etas, step_sizes, Adafactor's eps) has as many values as its default, which
    the constructors index without checking."""
    twin = _twin(cls)
    own = inspect.signature(twin.__init__).parameters
    options = [p for p in inspect.signature(FusedOptimizerMixin.__init__).parameters.values()
               if p.kind is p.KEYWORD_ONLY and p.name not in own
               and not (p.name == "norm_type" and "max_grad_norm" in own)]
    signature = inspect.Signature([p for p in own.values() if p.kind is not p.VAR_KEYWORD] + options)
    sizes = {name: len(p.default) for name, p in own.items() if isinstance(p.default, tuple)}
    init = cls.__init__  # its own (FusedLAMB) or the mixin's

    def __init__(self, *args, **kwargs):
        try:
            given = signature.bind(self, *args, **kwargs).arguments
        except TypeError:  # the constructor says what is wrong, as before
            given = {}
        for name, size in sizes.items():
            value = given.get(name, own[name].default)
            try:
                n = len(value)
            except TypeError:
                raise TypeError(f"{cls.__name__}: {name} must be a sequence of {size} values, got {value!r}") from None
            if n != size:
                raise ValueError(f"{cls.__name__}: invalid {name}: {value!r} (it must have {size} values, as the "
                                 f"default {own[name].default!r})")
        init(self, *args, **kwargs)

    # (an option missing from _OPTIONS shows undocumented: test_client_inputs.py fails, the import does not)
    args = "\n".join(f"    {p.name} ({p.annotation}, default {p.default!r}): {_OPTIONS.get(p.name, '')}" for p in options)
    reference = f"torch.optim.{twin.__name__}" if twin.__module__.startswith("torch.optim") else "its reference (above)"
    __init__.__doc__ = (f"Arguments: those of {reference}, with its defaults, then fusedopt's keyword-only "
                        f"options.\n\nArgs:\n{args}\n")
    __init__.__signature__ = signature
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    cls.__init__ = __init__
    summary = cls.__dict__.get("__doc__") or f"{reference} with a fused step() (fusedopt.optim)."
    cls.__doc__ = f"{summary}\n\n{__init__.__doc__}"


# Every class that pairs the mixin with its twin (not _AdamLike, which only shares the Adam step).
for _cls in [c for c in list(globals().values())
             if isinstance(c, type) and issubclass(c, FusedOptimizerMixin) and _twin(c) in c.__bases__]:
    _publish_signature(_cls)
