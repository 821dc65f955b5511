"""The fused optimizers. Each one with a torch.optim twin *is* that twin (a subclass), so it takes the
same arguments with the same defaults and errors, keeps the same param_groups and state (per-param
state['step'], torch's state keys and dtypes) and exchanges state_dicts with torch both ways; only
step() is replaced by one fused pass over all parameters (see _base.py). FusedLion, FusedLAMB, FusedLARS,
FusedRMSpropTF, FusedAdamP and FusedBertAdam take the arguments of their references (lion-pytorch's Lion, apex's
FusedLAMB, apex's LARC around torch.optim.SGD, torch_npu's NpuFusedRMSpropTF, clovaai's AdamP, torch_npu's
NpuFusedBertAdam) in the same way, and step the params the engine cannot take with _references. FusedRMSpropTF,
FusedLARS, FusedAdamP and FusedBertAdam subclass their reference of _references (the mixin's step comes first): its
constructor makes and checks their param groups, and _check_defaults adds what the fused class checks beyond it.

A class says little of its algorithm: the Hyper and its group keys come from the C++ descriptor
(_hypers.py), what is left here is where the reference differs. Every class's signature (inspect.signature)
lists its twin's parameters with the twin's defaults, then fusedopt's own keyword-only options (_signature.py;
master_weights, flatten, max_grad_norm, accumulation_steps, ...), and its docstring documents each option.
"""

from __future__ import annotations

import math
from itertools import chain

from torch.optim.optimizer import required

import torch

from . import _C, _references
from ._base import FusedOptimizerMixin
from ._fallback import _grad_norm
from ._generic import generic_class
from ._hypers import group_number as _f  # hyper-parameters may be 1-element tensors (lr, betas)
from ._signals import _Skipped
from ._signature import _publish_signature, _twin
from ._tensors import route_error


class FusedSGD(FusedOptimizerMixin, torch.optim.SGD):
    _algorithm = "sgd"
    _takes_sparse = True
    _sparse_message = "fusedopt: FusedSGD does not support sparse gradients (strict=True)"


class _AdamLike(FusedOptimizerMixin):
    """FusedAdam and FusedAdamW both take the engine's adam step: torch 2.13's AdamW is an Adam whose groups hold
    decoupled_weight_decay=True, a field of AdamHyper."""

    _algorithm = "adam"


class FusedAdam(_AdamLike, torch.optim.Adam):
    _sparse_message = "Adam does not support sparse gradients, please consider SparseAdam instead"


class FusedAdamW(_AdamLike, torch.optim.AdamW):
    _sparse_message = FusedAdam._sparse_message  # torch 2.13's AdamW is an Adam and says the same


class FusedRMSprop(FusedOptimizerMixin, torch.optim.RMSprop):
    _algorithm = "rmsprop"
    _sparse_message = "RMSprop does not support sparse gradients"


class FusedAdagrad(FusedOptimizerMixin, torch.optim.Adagrad):
    _algorithm = "adagrad"
    _takes_sparse = True
    _sparse_message = "fusedopt: FusedAdagrad does not support sparse gradients (strict=True)"

    def _initial_state_value(self, key, group, p, hyper):
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
    _sparse_message = "fusedopt: FusedLion does not support sparse gradients"

    def _hyper_arguments(self, g):
        arguments = super()._hyper_arguments(g)
        if self.decoupled_wd:  # lion-pytorch divides the decay by the constructor's lr
            arguments["weight_decay"] /= self._init_lr
        return arguments

    _reference_step = _references.lion_step


def _check_adam(lr, eps, betas, weight_decay) -> None:
    """torch.optim.Adam's checks of these, with its texts, as apex FusedLAMB makes them (FusedAdamP too)."""
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not eps >= 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class _LambGroups(torch.optim.Optimizer):
    """apex FusedLAMB's constructor (arguments, defaults, checks, param groups); FusedLAMB supplies the step."""

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, amsgrad: bool = False, adam_w_mode: bool = True,
                 grad_averaging: bool = True, set_grad_none: bool = True, max_grad_norm: float = 1.0,
                 use_nvlamb: bool = False):
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        _check_adam(lr, eps, betas, weight_decay)
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

    _reference_step = _references.lamb_step


class FusedAdamax(FusedOptimizerMixin, torch.optim.Adamax):
    """torch.optim.Adamax, fused: exp_avg.lerp_(g, 1 - beta1), exp_inf = max(beta2 * exp_inf, |g| + eps),
    p -= lr / (1 - beta1**step) * exp_avg / exp_inf (torch's single-tensor path, bit for bit)."""

    _algorithm = "adamax"
    _sparse_message = "Adamax does not support sparse gradients"


class FusedAdadelta(FusedOptimizerMixin, torch.optim.Adadelta):
    """torch.optim.Adadelta, fused: square_avg = rho * square_avg + (1 - rho) * g², delta = sqrt(acc_delta + eps)
    / sqrt(square_avg + eps) * g, acc_delta = rho * acc_delta + (1 - rho) * delta², p -= lr * delta (torch's
    single-tensor order; an IEEE sqrt where torch's CPU wheel rounds some values one ulp off)."""

    _algorithm = "adadelta"
    _sparse_message = "Adadelta does not support sparse gradients"


class FusedRAdam(FusedOptimizerMixin, torch.optim.RAdam):
    """torch.optim.RAdam, fused: Adam's moments; while rho_t <= 5 (steps 1-5 for beta2 near 1) the step is
    p -= lr * exp_avg / bias_correction1, later the rectified adaptive step. The branch depends only on the
    step, so the engine takes it per tensor. decoupled_weight_decay=True decays as AdamW."""

    _algorithm = "radam"
    _sparse_message = "RAdam does not support sparse gradients"


class FusedNAdam(FusedOptimizerMixin, torch.optim.NAdam):
    """torch.optim.NAdam, fused: Adam's moments with Nesterov momentum whose coefficient mu_t warms up with
    momentum_decay; each param's state['mu_product'] (a 0-d f32 tensor, as torch keeps it) is advanced by the
    engine in f32 and read for the step's two coefficients. decoupled_weight_decay=True decays as AdamW."""

    _algorithm = "nadam"
    _sparse_message = "NAdam does not support sparse gradients"


class FusedRMSpropTF(FusedOptimizerMixin, _references.rmsproptf.RMSpropTFReference):
    """RMSpropTF (TensorFlow's RMSprop) with torch_npu NpuFusedRMSpropTF's arguments, defaults and formulas (the
    old timm RMSpropTF), fused: eps inside the sqrt, square_avg starting at ones, sq += (1 - alpha)(g² - sq);
    weight decay added to the gradient, or with decoupled_decay p *= 1 - weight_decay (not scaled by lr, as
    the NPU class and old timm; current timm uses 1 - lr * weight_decay); momentum with lr folded into the
    buffer (lr_in_momentum=True) or scaling the step. State: step (a float32 0-d tensor, as torch.optim's;
    the NPU keeps an int), square_avg, momentum_buffer (momentum > 0), grad_avg (centered)."""

    _algorithm = "rmsproptf"
    _sparse_message = "fusedopt: FusedRMSpropTF does not support sparse gradients"

    _reference_step = _references.rmsproptf_step


class FusedASGD(FusedOptimizerMixin, torch.optim.ASGD):
    """torch.optim.ASGD, fused: p = p * (1 - lambd * eta) - eta * g, then ax = p until averaging starts (mu == 1)
    and ax += mu * (p - ax) after; each param's state['eta'] and state['mu'] (0-d f32 tensors, as torch keeps
    them) are read by the step as the previous one left them and advanced by the engine: eta = lr / (1 + lambd
    * lr * step) ** alpha and mu = 1 / max(1, step - t0), in double, rounded to f32 as torch does (torch's
    single-tensor path, bit for bit)."""

    _algorithm = "asgd"
    _sparse_message = "ASGD does not support sparse gradients"


class FusedLARS(FusedOptimizerMixin, _references.lars.LarsReference):
    """LARS with NVIDIA apex LARC's semantics around torch.optim.SGD, fused: one pass for every tensor's ‖p‖ and
    ‖g‖, then SGD's momentum step on g scaled by LARC's trust ratio tc·‖p‖/(‖g‖ + ‖p‖·wd + eps) with the weight
    decay added first, where both norms are non-zero (else g as it is, without decay). clip=True (LARC's default)
    uses min(ratio / lr, 1), an effective lr of min(local lr, lr); clip=False scales lr by the ratio. The state is
    torch.optim.SGD's (momentum_buffer, no step). Unlike LARC, .grad is left as it is (LARC overwrites it with the
    scaled gradient). Reference: tools/lars_reference.py."""

    _algorithm = "lars"
    _sparse_message = "fusedopt: FusedLARS does not support sparse gradients"

    def _check_defaults(self, trust_coefficient, eps, **others):
        """LarsReference's checks (torch.optim.SGD's), after SGD's check of a tensor lr and before two of its own."""
        if isinstance(others["lr"], torch.Tensor) and others["lr"].numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        super()._check_defaults(trust_coefficient=trust_coefficient, eps=eps, **others)
        # apex LARC checks nothing; a negative trust coefficient or eps would turn the step uphill.
        if not trust_coefficient >= 0.0:
            raise ValueError(f"Invalid trust_coefficient value: {trust_coefficient}")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")

    _reference_step = _references.lars_step


class FusedRprop(FusedOptimizerMixin, torch.optim.Rprop):
    """torch.optim.Rprop, fused: per element, f = sign(g * prev) becomes etaplus (> 0), etaminus (< 0) or 1 (== 0),
    step_size = clamp(step_size * f, *step_sizes), g = 0 where f == etaminus, p -= sign(g) * step_size, prev = g
    (torch's single-tensor path, bit for bit). A new step_size starts at its group's lr (lr + lr*1j for a
    complex param, as torch)."""

    _algorithm = "rprop"
    _sparse_message = "Rprop does not support sparse gradients"

    def _initial_state_value(self, key, group, p, hyper):
        # torch: full_like(grad, lr), or complex(lr, lr) for a complex param
        if key != "step_size":
            return 0.0
        lr = _f(group, "lr")
        return complex(lr, lr) if p.is_complex() else lr


class FusedAdamP(FusedOptimizerMixin, _references.adamp.AdampReference):
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

    def _check_defaults(self, lr, betas, eps, weight_decay, delta, wd_ratio, **_):
        """torch.optim.Adam's checks, then delta's and wd_ratio's (clovaai's AdamP checks nothing)."""
        _check_adam(lr, eps, betas, weight_decay)
        if not delta >= 0.0:
            raise ValueError(f"Invalid delta value: {delta}")
        if not (wd_ratio >= 0.0 and math.isfinite(wd_ratio)):
            raise ValueError(f"Invalid wd_ratio value: {wd_ratio}")

    def _route(self, p, g, gi, j):
        route = super()._route(p, g, gi, j)
        if route is None and p.dim() > 1 and p.shape[0] > 1 and p.stride(0) * p.shape[0] != p.numel():
            reason = (f"its channel rows (dimension 0, of shape {tuple(p.shape)} and strides {p.stride()}) are not "
                      "contiguous in memory")
            if self._strict:
                raise route_error((ValueError, reason), self._name(gi, j))
            return reason
        return route

    _reference_step = _references.adamp_step


class FusedBertAdam(FusedOptimizerMixin, _references.bert_adam.BertAdamReference):
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
        self.max_grad_norm = max_grad_norm  # the NPU class's attribute (the step reads each group's)

    def _check_defaults(self, t_total, **others):
        """BertAdamReference's checks (the NPU class's), then one of its own."""
        super()._check_defaults(t_total=t_total, **others)
        # The reference leaves t_total unchecked: 0 divides by zero at the first step.
        if not (t_total == -1 or t_total > 0):
            raise ValueError(f"Invalid t_total: {t_total} (must be -1 or > 0)")

    def _step_with_torch(self, packed, grad_scale, found_out, grads=None):
        """Some params take the reference's step: every param does, in this step (see the class docstring). With
        none routed (DTensor params, whose Inf check spans the ranks), the mixin's: the engine clips per buffer."""
        if not packed.routed:
            return super()._step_with_torch(packed, grad_scale, found_out, grads)
        self._warn_routed(packed.routed)
        self.last_grad_norm = None
        grads = {p: p.grad if grads is None else grads[p] for p in dict.fromkeys(chain(packed.params, packed.routed))}
        if found_out is not None and not math.isfinite(_grad_norm(list(grads.values()), 2)):
            found_out.fill_(1.0)
            raise _Skipped
        # The engine's checks of the hyper-parameters, before any update.
        self._check_hypers(packed.hypers)
        if grad_scale == 1.0:
            self._torch_step(grads)
        else:  # as torch's GradScaler.unscale_ multiplies, by an f32 factor
            factor = torch.tensor(grad_scale, dtype=torch.float32)
            self._torch_step({p: g * factor.to(g.device) for p, g in grads.items()})

    def _micro_batch(self):
        out = super()._micro_batch()
        routed = out[4]
        if routed and any(_f(g, "max_grad_norm") > 0 for g in self.param_groups):
            raise ValueError("fusedopt: FusedBertAdam's max_grad_norm with accumulation_steps > 1 needs every "
                             f"parameter on the fused path; {'; '.join(routed.values())}")
        return out

    _reference_step = _references.bert_adam_step


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

    _hypers_read_group_only = False  # eps1 may come from the params' dtype

    def _hyper_arguments(self, g):
        _f(g, "eps", 1)  # (first: it checks that eps holds two values)
        arguments = super()._hyper_arguments(g)
        if "eps1" not in arguments:  # None. torch: finfo(param.dtype).eps of the first param with a grad
            in_backward = self._step_in_backward and self._accumulation_steps == 1  # (a window updates in step())
            if in_backward and len({p.dtype for p in g["params"] if p.requires_grad}) > 1:
                raise ValueError("FusedAdafactor: step_in_backward=True with eps=(None, ...) takes a group of params "
                                 "of one dtype: eps1 is then finfo(dtype).eps of the group's first param with a "
                                 "gradient, which backward may not have made yet when a bucket is updated; pass "
                                 "eps1 explicitly")
            # (with accumulation, a grad in any micro-batch of the window: torch's loop would hold their sum)
            dtype = next((p.dtype for p in g["params"] if p.grad is not None or p in self._window), torch.float32)
            arguments["eps1"] = torch.finfo(dtype).eps
        return arguments

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


# fusedopt's public classes: the fused class of every algorithm of the registry, in its order, each named
# "Fused" + its reference's class name (the descriptor's kTorchName): the one above, or one made from the descriptor.
FUSED_CLASSES = {}
for _name, _entry in _C.algorithms.items():
    _class_name = f"Fused{_entry['torch_name']}"
    if _class_name not in globals():
        globals()[_class_name] = generic_class(_name, _entry, __name__)
    FUSED_CLASSES[_class_name] = globals()[_class_name]

# Every class that pairs the mixin with its twin (not _AdamLike, which only shares the Adam step).
for _cls in [c for c in list(globals().values())
             if isinstance(c, type) and issubclass(c, FusedOptimizerMixin) and _twin(c) in c.__bases__]:
    _publish_signature(_cls)
