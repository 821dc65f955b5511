"""The Python tests' one table of per-algorithm cases: what the generic tests need to know of each algorithm.

CASES has one entry per algorithm of the registry, keyed by the registry's name (fusedopt._C.algorithms), in the
registry's order. The generic tests iterate it (mostly through conftest.NAMES, TORCH, FUSED, BASE_KW, ...), so that
no other test file but an algorithm's own test_<algo>.py names an algorithm. Every value here is written by hand
from the reference's documented behaviour (torch.optim's, or the reference library's), never read back from the
descriptor it checks. A new algorithm adds its entry here; the fields it leaves at their defaults opt it out of the
scenarios that need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fusedopt
from torch.optim.optimizer import required

import torch

T = torch.tensor


# The constructors of the references without a torch.optim twin, as their libraries define them: lion-pytorch's Lion,
# apex's FusedLAMB, torch.optim.SGD's arguments then apex LARC's, torch_npu's NpuFusedRMSpropTF (timm's RMSpropTF),
# clovaai's AdamP, pytorch-pretrained-bert's BertAdam.
def _lion(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, use_triton=False,
          decoupled_weight_decay=False): ...
def _lamb(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
          amsgrad=False, adam_w_mode=True, grad_averaging=True, set_grad_none=True, max_grad_norm=1.0,
          use_nvlamb=False): ...
def _lars(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
          trust_coefficient=0.02, clip=True, eps=1e-8): ...
def _rmsproptf(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0.0, centered=False,
               decoupled_decay=False, lr_in_momentum=True): ...
def _adamp(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, delta=0.1, wd_ratio=0.1,
           nesterov=False): ...
def _bert_adam(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
               e=1e-6, weight_decay=0.01, max_grad_norm=1.0): ...


@dataclass(frozen=True)
class Case:
    # ---- the classes ----
    fused: type  # the fused class
    torch: type | None = None  # its torch.optim twin (None: the reference is another library's class)
    reference_init: object = None  # without a twin: the reference's constructor (its signature is the fused class's)
    # run by the generic suites against torch.optim's single-tensor for-loop (conftest.NAMES: test_api, test_parity,
    # test_errors, test_fallback, ...)
    parity_suite: bool = False

    # ---- numerics ----
    # the rule has no square root: with float hyper-parameters the fused step reproduces torch's for-loop bit for
    # bit as torch is (the others agree within a relative bound, torch's CPU fp32 sqrt not being correctly rounded)
    sqrt_free: bool = False
    # options under which the rule takes the sqrt of a difference that nearly cancels, so that torch's 1-ulp sqrt
    # errors grow to ~3e-5 relative over 100 steps (test_parity's rtol 1e-4 instead of 1e-5)
    cancelling_sqrt_options: tuple = ()
    # per-param 0-d f32 scalars in the state (not buffers): torch keeps them in f32 for 16-bit params, and its
    # load_state_dict casts them to a float64 param's dtype (torch's own steps after a load then differ ~1e-12
    # from its unloaded run)
    scalar_states: tuple = ()

    # ---- option sets (each a constructor's keyword arguments) ----
    defaults: dict = field(default_factory=dict)  # a typical option set, where the scenario is not about options
    two_groups: list = field(default_factory=list)  # overrides of param groups 1 and 2 (group 0: the constructor's)
    added_group: dict = field(default_factory=dict)  # a group added mid-training (test_api)
    option_sets: list = field(default_factory=list)  # test_parity's fp32 option sets (the last: the thread check)
    # test_parity's group overrides for the option sets with tensor hyper-parameters (None: its generic ones)
    tensor_group_kw: list | None = None
    low_precision_option_sets: list = field(default_factory=list)  # test_parity's 16-bit runs
    master_weights_options: dict = field(default_factory=dict)  # test_parity's master_weights runs
    duplicate_params_options: dict = field(default_factory=dict)  # test_defects: duplicated / overlapping params
    scheduler_options: dict = field(default_factory=dict)  # test_schedulers' options (groups: lr / 2 and lr * 2)
    # the schedules test_schedulers runs it under: "warmup_cosine", "onecycle" (needs momentum or betas), "step"
    schedulers: tuple = ()

    # ---- bad input ----
    bad_constructor_args: list = field(default_factory=list)  # raise torch's error at construction
    bad_group_edits: list = field(default_factory=list)  # (key, value) set mid-training: a ValueError naming it
    # (key, value, field) set in a param group: a hyper-parameter that is not one number, named by the step
    tensor_hyper_defects: list = field(default_factory=list)

    # ---- state ----
    state_key: str | None = None  # a state tensor whose storage test_api swaps through .data
    counts_steps: bool = True  # the reference keeps a per-param state['step']
    eager_state: bool = False  # torch creates the state at construction (a param never stepped has one)

    # ---- torch's paths and what torch's step takes ----
    torch_has_fused: bool = False  # torch 2.13 has a fused=True implementation (test_api's state_dict exchange)
    # torch's fused step cannot step a group where some params already have state and others not yet
    # (test_api then gives every param a grad on every step)
    torch_fused_needs_every_grad: bool = False
    # torch's step takes sparse grads (an embedding's) with these options; None: it does not
    sparse_grad_options: dict | None = None
    sparse_grad_is_torchs_error: bool = False  # torch's step raises on a sparse grad; the fused one raises the same
    # how many steps torch's differentiable=True step can be backpropagated through (None: any number); beyond it
    # torch raises, and so must the fused class (it takes torch's step)
    differentiable_backward_steps: int | None = None
    tuple_hypers: tuple = ()  # the constructor's tuple hyper-parameters (a short one is a named ValueError)

    # ---- torch's own test suite (test_torch_test_optim.py) ----
    # torch's skips on the CPU (optim_db's DecorateInfo entries): test name -> torch's reason
    torch_suite_skips: dict = field(default_factory=dict)
    # the outer options test_param_groups_lr adds for this class's __name__ only
    torch_suite_lr_outer_options: dict = field(default_factory=dict)
    # the lr test_step_is_noop_for_zero_grads gives this class's __name__ only (None: no adjustment)
    torch_suite_zero_grad_lr: float | None = None

    # ---- the package and the tools ----
    required_options: dict = field(default_factory=dict)  # constructor arguments without a default
    checkpoint_interop: bool = False  # tests/checkpoint_interop.cc trains it (test_checkpoint_interop.py)
    checkpoint_interop_options: dict = field(default_factory=dict)  # the Python leg's options there
    libtorch_checkpoint_interop: bool = False  # so does checkpoint_interop_pt.cc (a fusedopt::pt optimizer)
    tools_reference: bool = False  # tools/<name>_reference.py re-exports the package's reference
    # the hand-written class reads a field, fills a state or routes params otherwise than the class generated from
    # its descriptor alone (test_registry_classes does not compare them)
    generic_class_differs: bool = False

    @property
    def name(self) -> str:
        """The public name: the fused class's without "Fused" (its torch twin's, where it has one)."""
        return self.fused.__name__.removeprefix("Fused")


CASES: dict[str, Case] = {
    "sgd": Case(
        fused=fusedopt.FusedSGD, torch=torch.optim.SGD, parity_suite=True, sqrt_free=True, counts_steps=False,
        defaults=dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
        two_groups=[dict(lr=0.02, weight_decay=0.0), dict(lr=0.1, momentum=0.5)],
        added_group=dict(lr=0.03, momentum=0.8),
        option_sets=[
            dict(lr=0.05),  # momentum 0 (group 2 has momentum 0.5: mixed groups)
            dict(lr=0.05, momentum=0.9),
            dict(lr=0.05, momentum=0.9, dampening=0.3),
            dict(lr=0.05, momentum=0.9, nesterov=True),
            dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
            dict(lr=0.05, weight_decay=1e-2, maximize=True),
            dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2, maximize=True),
        ],
        low_precision_option_sets=[dict(lr=0.05), dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
                                   dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)],
        master_weights_options=dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
        duplicate_params_options=dict(lr=0.1, momentum=0.9, weight_decay=0.1),
        scheduler_options=dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
        schedulers=("warmup_cosine", "onecycle", "step"),
        bad_constructor_args=[dict(lr=-1), dict(momentum=-0.1), dict(weight_decay=-1), dict(nesterov=True),
                              dict(nesterov=True, momentum=0.9, dampening=0.1), dict(lr=torch.tensor([1e-3, 1e-3]))],
        bad_group_edits=[("lr", -1.0), ("lr", float("nan")), ("momentum", -0.5), ("weight_decay", -0.5)],
        tensor_hyper_defects=[("lr", torch.tensor([0.1, 0.2]), "['lr']")],
        state_key="momentum_buffer",
        torch_has_fused=True, torch_fused_needs_every_grad=True,
        sparse_grad_options=dict(lr=0.1, momentum=0.9),
        checkpoint_interop=True, libtorch_checkpoint_interop=True,
    ),
    "adam": Case(
        fused=fusedopt.FusedAdam, torch=torch.optim.Adam, parity_suite=True,
        defaults=dict(lr=1e-2, weight_decay=1e-2, amsgrad=True),
        two_groups=[dict(lr=3e-3, betas=(0.8, 0.99)), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
        added_group=dict(lr=5e-3, betas=(0.5, 0.9)),
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, amsgrad=True),
            dict(lr=1e-2, weight_decay=0.1),
            dict(lr=1e-2, maximize=True),
            dict(lr=1e-2, amsgrad=True, weight_decay=0.1, maximize=True),
            dict(lr=T(1e-2), betas=(T(0.9), T(0.99))),
        ],
        low_precision_option_sets=[dict(lr=1e-2), dict(lr=1e-2, amsgrad=True, weight_decay=0.1)],
        master_weights_options=dict(lr=1e-2, amsgrad=True, weight_decay=0.1),
        duplicate_params_options=dict(lr=0.01, weight_decay=0.1, amsgrad=True),
        scheduler_options=dict(lr=1e-2, amsgrad=True),
        schedulers=("step",),
        bad_constructor_args=[dict(lr=-1), dict(eps=-1), dict(betas=(1.0, 0.999)), dict(betas=(0.9, -0.1)),
                              dict(weight_decay=-1), dict(betas=(torch.tensor(0.9), 0.99)),
                              dict(lr=torch.tensor(0.1), foreach=True), dict(fused=True, foreach=True)],
        bad_group_edits=[("lr", -1.0), ("lr", float("nan")), ("eps", -1.0), ("betas", (1.5, 0.9)),
                         ("betas", (0.9, 1.0)), ("weight_decay", -0.5)],
        tensor_hyper_defects=[("lr", torch.tensor([0.1, 0.2]), "['lr']"),
                              ("betas", (torch.tensor([0.9, 0.8]), 0.999), "['betas'][0]")],
        state_key="exp_avg",
        torch_has_fused=True, sparse_grad_is_torchs_error=True, tuple_hypers=("betas",),
    ),
    "adamw": Case(
        fused=fusedopt.FusedAdamW, torch=torch.optim.AdamW, parity_suite=True,
        defaults=dict(lr=1e-2, weight_decay=0.1),
        two_groups=[dict(lr=3e-3, betas=(0.8, 0.99)), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
        added_group=dict(lr=5e-3, weight_decay=0.5),
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, amsgrad=True),
            dict(lr=1e-2, weight_decay=0.3),
            dict(lr=1e-2, maximize=True),
            dict(lr=1e-2, amsgrad=True, weight_decay=0.1, maximize=True),
            dict(lr=T(1e-2), betas=(T(0.9), T(0.99))),
        ],
        low_precision_option_sets=[dict(lr=1e-2, weight_decay=0.1)],
        master_weights_options=dict(lr=1e-2, weight_decay=0.1),
        duplicate_params_options=dict(lr=0.01, weight_decay=0.1),
        scheduler_options=dict(lr=1e-2, weight_decay=0.05),
        schedulers=("warmup_cosine", "onecycle"),
        bad_constructor_args=[dict(lr=-1), dict(eps=-1e-3), dict(betas=(0.9, 1.0)), dict(betas=(-0.1, 0.9)),
                              dict(weight_decay=-1e-3)],
        bad_group_edits=[("lr", -1.0), ("betas", (0.9, -0.1))],
        state_key="exp_avg_sq",
        torch_has_fused=True, sparse_grad_is_torchs_error=True, tuple_hypers=("betas",),
        # its default decay (a factor 1 - lr * 0.01 per step) stays within assertEqual's tolerance
        torch_suite_zero_grad_lr=1e-5,
        checkpoint_interop=True, libtorch_checkpoint_interop=True,
    ),
    "rmsprop": Case(
        fused=fusedopt.FusedRMSprop, torch=torch.optim.RMSprop, parity_suite=True,
        cancelling_sqrt_options=("centered",),  # sqrt(square_avg - grad_avg^2)
        defaults=dict(lr=1e-2, momentum=0.5, centered=True),
        two_groups=[dict(lr=3e-3, alpha=0.9), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
        added_group=dict(lr=5e-3, alpha=0.5),
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, centered=True),
            dict(lr=1e-2, momentum=0.9),
            dict(lr=1e-2, weight_decay=0.1),
            dict(lr=1e-2, maximize=True),
            dict(lr=1e-2, centered=True, momentum=0.9, weight_decay=0.1, maximize=True),
        ],
        low_precision_option_sets=[dict(lr=1e-2), dict(lr=1e-2, momentum=0.9, centered=True)],
        master_weights_options=dict(lr=1e-2, momentum=0.9, centered=True),
        duplicate_params_options=dict(lr=0.01, momentum=0.5, centered=True, weight_decay=0.1),
        scheduler_options=dict(lr=1e-2, momentum=0.5),
        schedulers=("warmup_cosine",),
        bad_constructor_args=[dict(lr=-1), dict(alpha=-0.1), dict(eps=-1), dict(momentum=-1), dict(weight_decay=-1)],
        bad_group_edits=[("lr", -1.0), ("alpha", -1.0), ("eps", -1.0), ("momentum", -1.0)],
        tensor_hyper_defects=[("momentum", torch.zeros(2, 2), "['momentum']")],
        state_key="square_avg",
        sparse_grad_is_torchs_error=True,
    ),
    "adagrad": Case(
        fused=fusedopt.FusedAdagrad, torch=torch.optim.Adagrad, parity_suite=True, eager_state=True,
        defaults=dict(lr=5e-2, lr_decay=1e-2, weight_decay=1e-2),
        # initial_accumulator_value per group: torch 2.13 ignores it and uses the constructor's value.
        two_groups=[dict(lr=2e-2, lr_decay=0.0), dict(lr=0.1, weight_decay=0.0, initial_accumulator_value=0.5)],
        added_group=dict(lr=0.2, lr_decay=0.1),
        option_sets=[
            dict(lr=5e-2),
            dict(lr=5e-2, lr_decay=1e-2),
            dict(lr=5e-2, weight_decay=0.1),
            dict(lr=5e-2, initial_accumulator_value=0.1),
            dict(lr=5e-2, maximize=True),
            dict(lr=5e-2, lr_decay=1e-2, weight_decay=0.1, initial_accumulator_value=0.1, maximize=True),
        ],
        low_precision_option_sets=[dict(lr=5e-2, lr_decay=1e-2, weight_decay=0.1)],
        master_weights_options=dict(lr=5e-2, lr_decay=1e-2, weight_decay=0.1),
        duplicate_params_options=dict(lr=0.05, lr_decay=0.01, weight_decay=0.1),
        scheduler_options=dict(lr=0.05),
        schedulers=("step",),
        bad_constructor_args=[dict(lr=-1), dict(lr_decay=-1), dict(weight_decay=-1),
                              dict(initial_accumulator_value=-1), dict(eps=-1)],
        bad_group_edits=[("lr", -1.0), ("lr_decay", -1.0), ("eps", -1.0), ("weight_decay", -1.0)],
        tensor_hyper_defects=[("eps", "tiny", "['eps']")],
        state_key="sum",
        torch_has_fused=True, sparse_grad_options=dict(lr=0.1),
        generic_class_differs=True,
    ),
    "lion": Case(
        fused=fusedopt.FusedLion, reference_init=_lion, counts_steps=False, tuple_hypers=("betas",),
        checkpoint_interop=True, libtorch_checkpoint_interop=True, generic_class_differs=True,
    ),
    "lamb": Case(
        fused=fusedopt.FusedLAMB, reference_init=_lamb, tuple_hypers=("betas",),
        checkpoint_interop=True,
        # apex's global clipping: the C++ Optimizer clips only when Step() is told to
        checkpoint_interop_options={"max_grad_norm": float("inf")},
        tools_reference=True, generic_class_differs=True,
    ),
    "adamax": Case(
        fused=fusedopt.FusedAdamax, torch=torch.optim.Adamax, parity_suite=True, sqrt_free=True,
        defaults=dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=1e-2),
        two_groups=[dict(lr=3e-3, betas=(0.8, 0.999)), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
        added_group=dict(lr=5e-3, betas=(0.5, 0.9)),
        # (its own test file runs more option sets)
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1),
            dict(lr=1e-2, weight_decay=0.1, maximize=True),
            dict(lr=T(1e-2), betas=(T(0.9), T(0.99))),
        ],
        low_precision_option_sets=[dict(lr=1e-2, weight_decay=0.1)],
        master_weights_options=dict(lr=1e-2, weight_decay=0.1),
        duplicate_params_options=dict(lr=0.01, weight_decay=0.1),
        scheduler_options=dict(lr=1e-2, weight_decay=1e-2),
        schedulers=("warmup_cosine",),
        bad_constructor_args=[dict(lr=-1), dict(eps=-1), dict(betas=(1.0, 0.999)), dict(betas=(0.9, -0.1)),
                              dict(weight_decay=-1), dict(lr=torch.tensor([1e-3, 1e-3]))],
        bad_group_edits=[("lr", float("nan")), ("eps", -1.0), ("betas", (1.0, 0.9)), ("weight_decay", -0.5)],
        tensor_hyper_defects=[("betas", (0.9, torch.tensor([0.9, 0.99])), "['betas'][1]")],
        state_key="exp_inf",
        sparse_grad_is_torchs_error=True, tuple_hypers=("betas",),
        # torch 2.13's differentiable step updates exp_avg in place (lerp_) after the previous step's addcdiv_
        # saved it for backward, so a backward through two or more steps raises in torch itself ("... output 0
        # of Lerp, is at version 2; expected version 1")
        differentiable_backward_steps=1,
    ),
    "adadelta": Case(
        fused=fusedopt.FusedAdadelta, torch=torch.optim.Adadelta, parity_suite=True,
        defaults=dict(lr=0.5, rho=0.85, weight_decay=1e-2),
        two_groups=[dict(lr=0.2, rho=0.95), dict(lr=1.0, weight_decay=0.0, eps=1e-4)],
        added_group=dict(lr=0.3, rho=0.5),
        option_sets=[
            dict(lr=0.5),
            dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1),
            dict(lr=0.5, rho=1.0),  # torch allows rho = 1: the averages never change
            dict(lr=0.5, weight_decay=0.1, maximize=True),
            dict(lr=T(0.5)),
        ],
        tensor_group_kw=[dict(lr=T(0.2), rho=0.95), dict(lr=T(1.0), weight_decay=0.0)],  # (no betas)
        low_precision_option_sets=[dict(lr=0.5, rho=0.85, weight_decay=0.1)],
        master_weights_options=dict(lr=0.5, rho=0.85, weight_decay=0.1),
        duplicate_params_options=dict(lr=0.5, rho=0.85, weight_decay=0.1),
        scheduler_options=dict(lr=0.5, rho=0.85),
        schedulers=("step",),  # (neither momentum nor betas for OneCycleLR to cycle)
        bad_constructor_args=[dict(lr=-1), dict(rho=-0.1), dict(rho=1.5), dict(eps=-1), dict(weight_decay=-1),
                              dict(lr=torch.tensor([1.0, 1.0]))],
        bad_group_edits=[("lr", -1.0), ("rho", 1.5), ("rho", -0.5), ("eps", -1.0)],
        tensor_hyper_defects=[("rho", torch.zeros(2), "['rho']")],
        state_key="acc_delta",
        sparse_grad_is_torchs_error=True,
    ),
    "radam": Case(
        fused=fusedopt.FusedRAdam, torch=torch.optim.RAdam, parity_suite=True,
        # decoupled (AdamW-style) decay in groups 0 and 2, L2 decay in group 1
        defaults=dict(lr=1e-2, weight_decay=1e-2, decoupled_weight_decay=True),
        two_groups=[dict(lr=3e-3, betas=(0.8, 0.99), decoupled_weight_decay=False),
                    dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
        added_group=dict(lr=5e-3, betas=(0.5, 0.9), weight_decay=0.5),
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, weight_decay=0.1),
            dict(lr=1e-2, betas=(0.9, 0.6)),  # rho_inf = 4 <= 5: never rectified
            dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
            dict(lr=T(1e-2)),
        ],
        # a tensor lr only (as its own test file does)
        tensor_group_kw=[dict(lr=T(3e-3), betas=(0.8, 0.99)), dict(lr=T(2e-2), weight_decay=0.0)],
        low_precision_option_sets=[dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)],
        master_weights_options=dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
        duplicate_params_options=dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
        scheduler_options=dict(lr=1e-2, weight_decay=1e-2, decoupled_weight_decay=True),
        schedulers=("onecycle",),
        bad_constructor_args=[dict(lr=-1), dict(eps=-1e-3), dict(betas=(-0.1, 0.9)), dict(betas=(0.9, 1.0)),
                              dict(weight_decay=-1e-3), dict(lr=torch.tensor([1e-3, 1e-3]))],
        bad_group_edits=[("lr", -1.0), ("betas", (0.9, 1.5)), ("eps", -1.0), ("weight_decay", -0.5)],
        state_key="exp_avg_sq",
        sparse_grad_is_torchs_error=True, tuple_hypers=("betas",),
    ),
    "nadam": Case(
        fused=fusedopt.FusedNAdam, torch=torch.optim.NAdam, parity_suite=True,
        scalar_states=("mu_product",),
        defaults=dict(lr=1e-2, weight_decay=1e-2, momentum_decay=8e-3, decoupled_weight_decay=True),
        two_groups=[dict(lr=3e-3, betas=(0.8, 0.99), momentum_decay=2e-2, decoupled_weight_decay=False),
                    dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
        added_group=dict(lr=5e-3, momentum_decay=0.1, decoupled_weight_decay=False),
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, weight_decay=0.1, momentum_decay=0.05),
            dict(lr=1e-2, momentum_decay=0.0),
            dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
            dict(lr=T(1e-2)),
        ],
        # a tensor lr only (as its own test file does)
        tensor_group_kw=[dict(lr=T(3e-3), betas=(0.8, 0.99), momentum_decay=2e-2),
                         dict(lr=T(2e-2), weight_decay=0.0)],
        low_precision_option_sets=[dict(lr=1e-2, weight_decay=0.1, momentum_decay=8e-3)],
        master_weights_options=dict(lr=1e-2, weight_decay=0.1, momentum_decay=8e-3),
        duplicate_params_options=dict(lr=0.01, weight_decay=0.1, momentum_decay=8e-3),
        scheduler_options=dict(lr=1e-2, momentum_decay=8e-3),
        schedulers=("onecycle",),
        bad_constructor_args=[dict(lr=-1), dict(eps=-1), dict(betas=(1.0, 0.999)), dict(betas=(0.9, 1.5)),
                              dict(weight_decay=-1), dict(momentum_decay=-1e-3), dict(lr=torch.tensor([1e-3, 1e-3]))],
        bad_group_edits=[("lr", float("nan")), ("betas", (-0.1, 0.9)), ("momentum_decay", -0.5),
                         ("weight_decay", -0.5)],
        tensor_hyper_defects=[("momentum_decay", torch.tensor([1e-3, 2e-3]), "['momentum_decay']")],
        state_key="exp_avg",
        sparse_grad_is_torchs_error=True, tuple_hypers=("betas",),
        checkpoint_interop=True, libtorch_checkpoint_interop=True,
    ),
    "asgd": Case(
        fused=fusedopt.FusedASGD, torch=torch.optim.ASGD, parity_suite=True, sqrt_free=True,
        scalar_states=("eta", "mu"),
        # averaging starts at step 5 in group 0, so both phases of the rule run
        defaults=dict(lr=1e-2, weight_decay=1e-2, t0=5.0),
        two_groups=[dict(lr=3e-3, lambd=1e-3, t0=20.0), dict(lr=2e-2, weight_decay=0.0, alpha=0.5, t0=1e6)],
        added_group=dict(lr=5e-3, lambd=1e-3, t0=3.0),
        # (its own test file runs more option sets)
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, t0=3.0, weight_decay=0.1),
            dict(lr=5e-2, lambd=0.1, alpha=0.5, t0=10.0, maximize=True),
            dict(lr=T(1e-2), t0=5.0),
        ],
        tensor_group_kw=[dict(lr=T(3e-3), lambd=1e-3, t0=20.0), dict(lr=T(2e-2), weight_decay=0.0)],
        low_precision_option_sets=[dict(lr=1e-2, weight_decay=0.1, t0=3.0)],
        master_weights_options=dict(lr=1e-2, weight_decay=0.1, t0=3.0),
        duplicate_params_options=dict(lr=0.01, weight_decay=0.1, t0=3.0),
        scheduler_options=dict(lr=1e-2, t0=5.0),
        schedulers=("warmup_cosine",),
        bad_constructor_args=[dict(lr=-1), dict(weight_decay=-1), dict(lr=torch.tensor([1e-3, 1e-3]))],
        bad_group_edits=[("lr", -1.0), ("lr", float("nan")), ("weight_decay", -0.5)],
        tensor_hyper_defects=[("t0", torch.tensor([1.0, 2.0]), "['t0']")],
        state_key="ax",
        torch_suite_skips={"test_step_is_noop_for_zero_grads":
                           "ASGD internally changes the weights even with zero grad"},
        checkpoint_interop=True,
    ),
    "lars": Case(fused=fusedopt.FusedLARS, reference_init=_lars, counts_steps=False, tools_reference=True),
    "rprop": Case(
        fused=fusedopt.FusedRprop, torch=torch.optim.Rprop, parity_suite=True, sqrt_free=True,
        defaults=dict(lr=1e-2, etas=(0.4, 1.3)),
        two_groups=[dict(lr=3e-3, etas=(0.3, 1.5)), dict(lr=2e-2, step_sizes=(1e-4, 0.05))],
        added_group=dict(lr=5e-3, etas=(0.3, 1.6)),
        # (its own test file runs more option sets)
        option_sets=[
            dict(lr=1e-2),
            dict(lr=1e-2, etas=(0.25, 1.75), step_sizes=(1e-3, 2e-2)),
            dict(lr=1e-2, maximize=True),
            dict(lr=T(1e-2)),
        ],
        tensor_group_kw=[dict(lr=T(3e-3), etas=(0.3, 1.5)), dict(lr=T(2e-2))],
        low_precision_option_sets=[dict(lr=1e-2, etas=(0.4, 1.3))],
        master_weights_options=dict(lr=1e-2, etas=(0.4, 1.3)),
        duplicate_params_options=dict(lr=0.01, etas=(0.4, 1.3)),
        scheduler_options=dict(lr=1e-2),
        schedulers=("step",),
        bad_constructor_args=[dict(lr=-1), dict(etas=(0.0, 1.2)), dict(etas=(1.0, 1.2)), dict(etas=(0.5, 1.0)),
                              dict(lr=torch.tensor([1e-3, 1e-3]))],
        bad_group_edits=[("lr", -1.0), ("etas", (1.5, 1.2)), ("etas", (0.5, 0.9))],
        tensor_hyper_defects=[("etas", (0.5, torch.tensor([1.2, 1.3])), "['etas'][1]")],
        state_key="step_size",
        tuple_hypers=("etas", "step_sizes"),
        # a minimum step size of 0, so that a step size starting at lr=1e-28 stays below half an ulp of the
        # irrelevant param instead of being clamped up to the default minimum of 1e-6
        torch_suite_lr_outer_options={"step_sizes": (0, 50)},
        checkpoint_interop=True, generic_class_differs=True,
    ),
    "rmsproptf": Case(fused=fusedopt.FusedRMSpropTF, reference_init=_rmsproptf, tools_reference=True),
    "adamp": Case(
        fused=fusedopt.FusedAdamP, reference_init=_adamp, tuple_hypers=("betas",),
        checkpoint_interop=True, tools_reference=True, generic_class_differs=True,
    ),
    "bert_adam": Case(
        fused=fusedopt.FusedBertAdam, reference_init=_bert_adam, required_options=dict(lr=1e-3),
        checkpoint_interop=True, tools_reference=True, generic_class_differs=True,
    ),
    "adafactor": Case(
        fused=fusedopt.FusedAdafactor, torch=torch.optim.Adafactor, tuple_hypers=("eps",),
        checkpoint_interop=True, generic_class_differs=True,
    ),
}

# The algorithms of the generic suites, by public name, in the registry's order.
PARITY = {case.name: case for case in CASES.values() if case.parity_suite}
# Every algorithm by its torch.optim twin.
BY_TORCH = {case.torch: case for case in CASES.values() if case.torch is not None}
