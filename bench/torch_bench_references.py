"""The implementations bench/torch_bench.py times fusedopt against where torch.optim has no twin: each
algorithm's reference (the first, which the others are checked against) and the third-party classes
people install for it, plus DeepSpeed's CPU Adam. Each constructor list imports its packages when it is
asked for, so the bench runs without those it does not time. tools/ is on sys.path (torch_bench.py)."""

from fusedopt import _C

LR = 1e-3
# Arguments beyond lr where the bench departs from the class's defaults (torch's or the reference's):
# `fusedopt bench`'s own (each descriptor's BenchHyper(), e.g. a momentum buffer in use), and LAMB's
# weight decay and clipping at apex FusedLAMB's defaults, which its references take.
BENCH_KWARGS = {name: {key: value for key, value in entry["bench_changes"].items() if key != "lr"}
                for name, entry in _C.algorithms.items()}
BENCH_KWARGS["lamb"] = {"weight_decay": 0.01, "max_grad_norm": 1.0}
LION_KW, LAMB_KW, LARS_KW = BENCH_KWARGS["lion"], BENCH_KWARGS["lamb"], BENCH_KWARGS["lars"]


def lion_references() -> dict:
    import lion_pytorch
    return {"lion_pytorch": lambda params: lion_pytorch.Lion(params, lr=LR, **LION_KW)}


def lamb_references() -> dict:
    import pytorch_optimizer
    from lamb_reference import LambReference

    def third_party(foreach):  # the closest options: wd added to the update, global-norm clipping
        return lambda params: pytorch_optimizer.Lamb(params, lr=LR, weight_decay=LAMB_KW["weight_decay"],
                                                     weight_decouple=False, pre_norm=True, eps=1e-6,
                                                     max_grad_norm=LAMB_KW["max_grad_norm"], foreach=foreach)

    return {"lamb_reference": lambda params: LambReference(params, lr=LR, **LAMB_KW),
            "pytorch_optimizer": third_party(False), "pytorch_optimizer_foreach": third_party(True)}


def rmsproptf_references() -> dict:
    from rmsproptf_reference import RMSpropTFReference
    return {"rmsproptf_reference": lambda params: RMSpropTFReference(params, lr=LR)}


def lars_references() -> dict:
    import pytorch_optimizer
    from lars_reference import LarcSGD, LarsReference

    def third_party(foreach):
        return lambda params: pytorch_optimizer.LARS(params, lr=LR, trust_coefficient=0.02, foreach=foreach, **LARS_KW)

    return {"lars_reference": lambda params: LarsReference(params, lr=LR, **LARS_KW),
            "larc_sgd": lambda params: LarcSGD(params, lr=LR, **LARS_KW),
            "pytorch_optimizer": third_party(False), "pytorch_optimizer_foreach": third_party(True)}


def adamp_references() -> dict:
    import adamp
    import pytorch_optimizer
    from adamp_reference import AdampReference

    def third_party(foreach):
        return lambda params: pytorch_optimizer.AdamP(params, lr=LR, foreach=foreach)

    return {"adamp": lambda params: adamp.AdamP(params, lr=LR), "adamp_reference": lambda params: AdampReference(
        params, lr=LR), "pytorch_optimizer": third_party(False), "pytorch_optimizer_foreach": third_party(True)}


def bert_adam_references() -> dict:
    from bert_adam_reference import BertAdamReference

    def hf(params):
        from pytorch_pretrained_bert.optimization import BertAdam
        return BertAdam(params, lr=LR)

    return {"bert_adam_reference": lambda params: BertAdamReference(params, lr=LR), "hf_bert_adam": hf}


def deepspeed_references(optimizer: str) -> dict:
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    weight_decay = 1e-2 if optimizer == "adamw" else 0.0  # torch's defaults
    return {"deepspeed_cpu_adam": lambda params: DeepSpeedCPUAdam(
        params, lr=LR, weight_decay=weight_decay, adamw_mode=optimizer == "adamw")}


# --optimizer -> its references' constructors (name -> constructor(params)), for the optimizers without a
# torch.optim twin.
REFERENCES = {"lion": lion_references, "lamb": lamb_references, "rmsproptf": rmsproptf_references,
              "lars": lars_references, "adamp": adamp_references, "bert_adam": bert_adam_references}
