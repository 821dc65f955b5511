"""The cases of the golden vectors (tests/golden/*.json), one entry per algorithm: its reference class, its
hyper-parameter sets and, where it needs them, its run length and tensor shapes. tools/make_golden.py runs them.

Seeds follow the order of SCENARIOS (1000 * (position + 1) + case index), so a new algorithm or case goes at the
end of its list: the files already written keep their bytes.
"""

import importlib.metadata
import os
import sys

from adamp import AdamP
from lion_pytorch import Lion

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: the references of our own
from bert_adam_reference import BertAdamReference  # noqa: E402
from lamb_reference import LambReference  # noqa: E402
from lars_reference import LarsReference  # noqa: E402
from rmsproptf_reference import RMSpropTFReference  # noqa: E402

# Algorithms whose files run longer: (steps, checkpoints). ASGD's step size decays with the step and its averaging
# starts only after t0 steps; Rprop's per-element step sizes grow and shrink until they reach their bounds;
# BertAdam's schedules run over t_total steps (and past them); Adafactor's rho = min(lr, 1/sqrt(t)) moves with t.
# Their cases run 100 steps.
LONG_RUNS = {
    "ASGD": (100, [1, 5, 20, 100]),
    "Rprop": (100, [1, 5, 20, 100]),
    "BertAdam": (100, [1, 5, 20, 100]),
    "Adafactor": (100, [1, 5, 20, 100]),
}

# References whose max_grad_norm is one global threshold (LAMB, as apex FusedLAMB): the case records it once.
GLOBAL_MAX_GRAD_NORM = (LambReference,)

# SCENARIOS[algorithm] = (reference class, [(case name, [hyper-parameters of each group])], [shapes]): one case of
# one group runs every tensor with a grad every step, one of two groups the "groups_none_grad" layout.
SCENARIOS = {
    "SGD": (
        torch.optim.SGD,
        [
            ("plain", [{"lr": 0.1}]),
            ("momentum", [{"lr": 0.1, "momentum": 0.9}]),
            ("momentum_dampening", [{"lr": 0.1, "momentum": 0.9, "dampening": 0.1}]),
            ("nesterov", [{"lr": 0.1, "momentum": 0.9, "nesterov": True}]),
            ("weight_decay_momentum", [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}]),
            ("maximize_weight_decay", [{"lr": 0.1, "weight_decay": 0.01, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 0.1, "momentum": 0.9},
                    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
                ],
            ),
        ],
    ),
    "Adam": (
        torch.optim.Adam,
        [
            ("default", [{"lr": 1e-2}]),
            ("amsgrad", [{"lr": 1e-2, "amsgrad": True}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    "AdamW": (
        torch.optim.AdamW,
        [
            ("default", [{"lr": 1e-2}]),
            ("amsgrad", [{"lr": 1e-2, "amsgrad": True}]),
            ("lr_weight_decay", [{"lr": 3e-3, "weight_decay": 0.1}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 5e-3, "weight_decay": 0.1},
                ],
            ),
        ],
    ),
    "RMSprop": (
        torch.optim.RMSprop,
        [
            ("default", [{"lr": 1e-2}]),
            ("centered", [{"lr": 1e-2, "centered": True}]),
            ("momentum", [{"lr": 1e-2, "momentum": 0.9}]),
            (
                "centered_momentum_weight_decay",
                [{"lr": 1e-2, "centered": True, "momentum": 0.9, "weight_decay": 0.01}],
            ),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "momentum": 0.5},
                    {"lr": 3e-3, "weight_decay": 0.05, "centered": True},
                ],
            ),
        ],
    ),
    "Adagrad": (
        torch.optim.Adagrad,
        [
            ("default", [{"lr": 0.1}]),
            ("lr_decay", [{"lr": 0.1, "lr_decay": 0.01}]),
            (
                "initial_accumulator_weight_decay",
                [{"lr": 0.1, "initial_accumulator_value": 0.1, "weight_decay": 0.01}],
            ),
            ("maximize", [{"lr": 0.1, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 0.1},
                    {"lr": 0.05, "weight_decay": 0.01, "lr_decay": 0.02},
                ],
            ),
        ],
    ),
    # The new algorithms come after the torch.optim ones: seeds follow SCENARIOS order, so appending keeps
    # the older files byte for byte.
    "Lion": (
        Lion,
        [
            ("default", [{"lr": 1e-3}]),
            ("weight_decay", [{"lr": 3e-3, "weight_decay": 0.1}]),
            ("betas", [{"lr": 3e-3, "betas": (0.95, 0.98)}]),
            # lion-pytorch divides wd by the constructor lr: p *= 1 - lr * (wd / init_lr) = 0.9 every step.
            ("decoupled_weight_decay", [{"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 3e-3, "weight_decay": 0.02},
                    {"lr": 1e-2, "weight_decay": 0.1},
                ],
            ),
        ],
    ),
    "LAMB": (
        LambReference,
        [
            # The hash grads have a global norm of about 6, so the default max_grad_norm=1.0 clips too.
            ("default", [{"lr": 1e-2}]),
            ("no_bias_correction", [{"lr": 1e-2, "bias_correction": False}]),
            ("l2_mode", [{"lr": 1e-2, "adam_w_mode": False, "weight_decay": 0.05}]),
            ("no_grad_averaging", [{"lr": 1e-2, "grad_averaging": False}]),
            ("no_weight_decay", [{"lr": 1e-2, "weight_decay": 0.0}]),  # no trust ratio
            ("nvlamb", [{"lr": 1e-2, "weight_decay": 0.0, "use_nvlamb": True}]),
            ("clipping", [{"lr": 1e-2, "max_grad_norm": 0.5}]),
            ("no_clipping", [{"lr": 1e-2, "max_grad_norm": 1e9}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 5e-3, "weight_decay": 0.1, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    # torch.optim classes added after Lion and LAMB: appended, so the older files keep their seeds.
    "Adamax": (
        torch.optim.Adamax,
        [
            ("default", [{"lr": 2e-2}]),
            ("weight_decay", [{"lr": 2e-2, "weight_decay": 0.05}]),
            ("betas", [{"lr": 1e-2, "betas": (0.8, 0.99)}]),
            ("maximize", [{"lr": 2e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 2e-2},
                    {"lr": 5e-3, "weight_decay": 0.02, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    "Adadelta": (
        torch.optim.Adadelta,
        [
            ("default", [{"lr": 1.0}]),
            ("weight_decay", [{"lr": 0.5, "weight_decay": 0.05}]),
            ("rho_eps", [{"lr": 1.0, "rho": 0.8, "eps": 1e-4}]),
            ("maximize", [{"lr": 1.0, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1.0},
                    {"lr": 0.5, "weight_decay": 0.02, "rho": 0.8},
                ],
            ),
        ],
    ),
    # beta2 = 0.999: steps 1-5 are not rectified (p -= lr * m_hat), steps 6-20 are.
    "RAdam": (
        torch.optim.RAdam,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05}]),
            ("decoupled_weight_decay", [{"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            ("never_rectified", [{"lr": 1e-2, "betas": (0.8, 0.6)}]),  # rho_inf = 4: no step is rectified
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    # state['mu_product'] (a 0-d f32 tensor) is recorded as a one-element list.
    "NAdam": (
        torch.optim.NAdam,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05}]),
            ("decoupled_weight_decay", [{"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            ("momentum_decay", [{"lr": 1e-2, "momentum_decay": 0.05}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99), "momentum_decay": 0.0},
                ],
            ),
        ],
    ),
    # Every combination of weight decay (none, coupled, decoupled) x centered x momentum (none, lr in the
    # buffer, lr on the step): 18 cases, then two groups. Momentum 0.5: with 0.9 the 1-element tensor's param
    # ends near 0 after cancellation in one case, where torch's non-IEEE sqrt puts it 1e-5 (relative) from a
    # correctly rounded kernel; with --exact-sqrt every buffer is bit for bit either way.
    "RMSpropTF": (
        RMSpropTFReference,
        [
            (
                f"{decay}_{'centered' if centered else 'plain'}_{mode}",
                [
                    {
                        "lr": 1e-2,
                        "weight_decay": 0.0 if decay == "no_decay" else 0.05,
                        "decoupled_decay": decay == "decoupled",
                        "centered": centered,
                        "momentum": 0.0 if mode == "no_momentum" else 0.5,
                        "lr_in_momentum": mode != "momentum_lr_on_step",
                    }
                ],
            )
            for decay in ("no_decay", "coupled", "decoupled")
            for centered in (False, True)
            for mode in ("no_momentum", "momentum_lr_in_buffer", "momentum_lr_on_step")
        ]
        + [
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "momentum": 0.5, "alpha": 0.8},
                    {"lr": 3e-3, "weight_decay": 0.02, "decoupled_decay": True, "centered": True, "eps": 1e-6},
                ],
            ),
        ],
    ),
    # 100 steps (LONG_RUNS). state['eta'] and state['mu'] (0-d f32 tensors) are recorded as one-element lists;
    # with torch's t0 = 1e6, ax stays a copy of the param, so most cases average from step t0 + 2 on.
    "ASGD": (
        torch.optim.ASGD,
        [
            ("default", [{"lr": 1e-2}]),
            ("t0", [{"lr": 1e-2, "t0": 10.0}]),
            ("lambd_alpha", [{"lr": 0.05, "lambd": 0.1, "alpha": 0.5, "t0": 30.0}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05, "t0": 5.0}]),
            ("maximize", [{"lr": 1e-2, "maximize": True, "t0": 20.0}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "t0": 15.0},
                    {"lr": 3e-3, "weight_decay": 0.02, "lambd": 1e-3, "t0": 40.0},
                ],
            ),
        ],
    ),
    # LARC's rate tc * ||p|| / (||g|| + wd * ||p|| + eps) is about 0.02 on these inputs: clip mode (the default)
    # scales lr 0.1 by about 0.2 and leaves lr 0.005 alone (min(rate / lr, 1) = 1).
    "LARS": (
        LarsReference,
        [
            ("default", [{"lr": 0.1}]),
            ("momentum", [{"lr": 0.1, "momentum": 0.9}]),
            ("dampening_weight_decay", [{"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}]),
            ("nesterov", [{"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}]),
            ("clipped_to_lr", [{"lr": 0.005, "momentum": 0.9, "weight_decay": 1e-4}]),
            ("scale_mode", [{"lr": 1.0, "momentum": 0.9, "clip": False, "trust_coefficient": 1e-3,
                             "weight_decay": 1e-4}]),
            # LARC's pitfall: adaptive_lr / lr = inf, min(inf, 1) = 1; the params stay, the buffer takes g + wd * p.
            ("lr_zero", [{"lr": 0.0, "momentum": 0.9, "weight_decay": 0.01}]),
            (
                "groups_none_grad",
                [
                    {"lr": 0.1, "momentum": 0.9},
                    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "trust_coefficient": 0.05, "clip": False,
                     "eps": 1e-4},
                ],
            ),
        ],
    ),
    # 100 steps (LONG_RUNS): step sizes that reach step_sizes' bounds, and every sign case.
    "Rprop": (
        torch.optim.Rprop,
        [
            ("default", [{"lr": 1e-2}]),
            ("etas", [{"lr": 1e-2, "etas": (0.25, 1.75)}]),
            ("step_sizes", [{"lr": 1e-2, "step_sizes": (1e-3, 3e-2)}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "etas": (0.4, 1.3), "step_sizes": (1e-4, 0.1)},
                ],
            ),
        ],
    ),
    # clovaai's adamp.AdamP itself (adamp 0.3.0). Tensors 2 and 3 are a (6, 11) and a (4, 2, 3, 3) param: the hash
    # gradients are unrelated to the params, so their |cos| is about 1/sqrt(row length): delta 0.1 projects a layer
    # now and then, delta 1 most layers and some channel views, delta 10 every channel view.
    "AdamP": (
        AdamP,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.1}]),
            ("layer_view", [{"lr": 1e-2, "weight_decay": 0.1, "delta": 1.0}]),
            ("channel_view", [{"lr": 1e-2, "weight_decay": 0.1, "delta": 10.0, "wd_ratio": 0.5}]),
            ("nesterov", [{"lr": 1e-2, "nesterov": True, "delta": 10.0, "weight_decay": 0.01}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "delta": 10.0},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99), "delta": 1.0},
                ],
            ),
        ],
        [(1,), (7,), (6, 11), (4, 2, 3, 3)],
    ),
    # 100 steps (LONG_RUNS). The gradients' norm per group is about 6 (sizes 1, 7, 33, 64, values in [-1, 1]):
    # max_grad_norm 1 (the default) clips every step, 5 some steps, -1 none. The schedules run past t_total
    # (warmup_linear and warmup_poly are 0 there, warmup_cosine rises again). Each group is one clipping buffer.
    "BertAdam": (
        BertAdamReference,
        [
            ("default", [{"lr": 1e-2}]),
            ("no_clipping", [{"lr": 1e-2, "max_grad_norm": -1.0}]),
            ("partly_clipped_no_weight_decay", [{"lr": 1e-2, "max_grad_norm": 5.0, "weight_decay": 0.0}]),
            ("betas_e_weight_decay", [{"lr": 1e-2, "b1": 0.8, "b2": 0.99, "e": 1e-4, "weight_decay": 0.1}]),
            ("warmup_linear", [{"lr": 1e-2, "warmup": 0.1, "t_total": 80}]),
            ("linear_without_warmup", [{"lr": 1e-2, "t_total": 100}]),
            ("warmup_constant", [{"lr": 1e-2, "warmup": 0.2, "t_total": 100, "schedule": "warmup_constant"}]),
            ("warmup_cosine", [{"lr": 1e-2, "warmup": 0.1, "t_total": 70, "schedule": "warmup_cosine"}]),
            ("warmup_poly", [{"lr": 1e-2, "warmup": 0.05, "t_total": 90, "schedule": "warmup_poly"}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.0, "max_grad_norm": 2.0, "t_total": 60, "warmup": 0.1,
                     "schedule": "warmup_cosine"},
                ],
            ),
        ],
    ),
    # torch.optim.Adafactor (new in torch 2.5), 100 steps (LONG_RUNS): rho = min(lr, 1/sqrt(t)) reaches lr after
    # 10^4 steps at lr 1e-2, so the large-lr cases exercise the 1/sqrt(t) branch. Tensors 1 and 2 are a (6, 11) and
    # a (3, 4, 5) param (factored over their last two dimensions; 3 is a batch), 0 and 3 vectors (variance).
    "Adafactor": (
        torch.optim.Adafactor,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.1}]),
            ("large_lr", [{"lr": 0.5, "weight_decay": 0.05, "d": 2.0}]),
            ("eps", [{"lr": 1e-2, "eps": (1e-3, 1e-2), "beta2_decay": -0.5}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "beta2_decay": -0.6, "eps": (1e-20, 1e-3)},
                ],
            ),
        ],
        [(1,), (6, 11), (3, 4, 5), (33,)],
    ),
}

# What each non-torch.optim file says about its reference (the torch.optim files have no such entry).
REFERENCES = {
    "Lion": {
        "reference": "lion_pytorch.Lion (lucidrains/lion-pytorch) %s; its state has no step; "
        "decoupled_weight_decay is a constructor argument (wd is divided by the constructor lr)",
    },
    "LAMB": {
        "reference": "tools/lamb_reference.py LambReference: apex FusedLAMB written from its formulas, with a "
        "per-param state step; max_grad_norm is global (each case's max_grad_norm; the group copies are ignored)",
    },
    "RMSpropTF": {
        "reference": "tools/rmsproptf_reference.py RMSpropTFReference: torch_npu NpuFusedRMSpropTF written from its "
        "formulas (eps inside the sqrt, square_avg starting at ones, decoupled decay p*(1 - wd) not scaled by lr), "
        "with a float32 tensor state step",
    },
    "AdamP": {
        "reference": "adamp.AdamP (clovaai/AdamP) %s, which torch_npu's NpuFusedAdamP ports; its state step is a "
        "Python int; each case's shapes give the params of more than one dimension (projected per channel row or "
        "per layer)",
    },
    "BertAdam": {
        "reference": "tools/bert_adam_reference.py BertAdamReference: torch_npu NpuFusedBertAdam written from its "
        "formulas (no bias correction, the warmup schedules, max_grad_norm clipping per (group, dtype) buffer), with "
        "a float32 tensor state step, incremented per param and read by the schedule before its increment",
    },
    "Adafactor": {
        "reference": "torch.optim.Adafactor (torch %s, _single_tensor_adafactor); each case's shapes give the params "
        "of more than one dimension (row_var and col_var over their last two dimensions, leading dimensions a "
        "batch); eps = (eps1, eps2), eps1 null: finfo(float32).eps. Not reproducible bit for bit: torch.norm and "
        "mean sum in their own order",
    },
    "LARS": {
        "reference": "tools/lars_reference.py LarsReference: apex LARC around torch.optim.SGD written from its "
        "formulas (norms in double rounded to float32, .grad untouched, per-group trust_coefficient/clip/eps); "
        "SGD's state (momentum_buffer, no step)",
    },
}

# The version each REFERENCES entry's %s names, read when the files are written.
REFERENCE_VERSIONS = {
    "Lion": lambda: importlib.metadata.version("lion-pytorch"),
    "AdamP": lambda: importlib.metadata.version("adamp"),
    "Adafactor": lambda: torch.__version__,
}
