"""fusedopt vs torch.optim on real parameter shapes, timed in one process.

For one optimizer and one shape set, five implementations each get their own params (randn, same
seed) and fixed random grads, set once and never zeroed, so only optimizer.step() is timed:

  torch_forloop  torch.optim.<X>(foreach=False)
  torch_foreach  torch.optim.<X>(foreach=True)
  torch_fused    torch.optim.<X>(fused=True), torch's own fused CPU kernel; null where torch has
                 none for <X> (torch 2.13 has one for SGD, Adam, AdamW and Adagrad only)
  fused          fusedopt.Fused<X>()
  fused_flat     fusedopt.Fused<X>(flatten=True); not for Adafactor (FusedAdafactor refuses it)
  engine         the C++ step alone: fusedopt's engine called on the segments the `fused` impl
                 packed, its very tensors, with no Python work per step but the call (what
                 `fusedopt bench` times); fused / engine - 1 is what the drop-in's Python side costs
                 (printed with its per-round spread)

Lion, LAMB and RMSpropTF have no torch.optim twin; their references run instead of the three torch impls:

  lion_pytorch               lucidrains' lion_pytorch.Lion (the reference of FusedLion)
  lamb_reference             tools/lamb_reference.py, apex FusedLAMB's formulas in torch ops (the
                             reference of FusedLAMB)
  rmsproptf_reference        tools/rmsproptf_reference.py, torch_npu NpuFusedRMSpropTF's formulas in torch
                             ops (the reference of FusedRMSpropTF)
  pytorch_optimizer          pytorch_optimizer.Lamb(foreach=False), the LAMB people pip-install;
  pytorch_optimizer_foreach  ... foreach=True. Its formula differs (trust ratio min(‖p‖, 10) /
                             (‖u‖ + eps), step size bias-corrected), so it is timed, not compared.

LARS (apex LARC around torch.optim.SGD) likewise:

  lars_reference             tools/lars_reference.py, LARC's norms and scaling then torch.optim.SGD's
                             for-loop step in torch ops (the reference of FusedLARS)
  larc_sgd                   tools/lars_reference.py's LarcSGD: apex LARC as written (float32 norms,
                             .grad scaled in place) around torch.optim.SGD(foreach=False); timed, not
                             compared (it rewrites the bench's fixed grads)
  pytorch_optimizer          pytorch_optimizer.LARS(foreach=False), trust coefficient 0.02;
  pytorch_optimizer_foreach  ... foreach=True. Its formula differs (no eps, no clip mode, 1-D params
                             plain SGD without decay; it scales .grad in place), so it is timed, not compared.

AdamP (clovaai's, which torch_npu's NpuFusedAdamP ports) likewise:

  adamp                      clovaai's adamp.AdamP (0.3.0; the reference of FusedAdamP)
  adamp_reference            tools/adamp_reference.py, its op-for-op copy (a tensor state['step'])
  pytorch_optimizer          pytorch_optimizer.AdamP(foreach=False);
  pytorch_optimizer_foreach  ... foreach=True. Its eps is scaled by sqrt(1 - beta2^t), so it is timed, not compared.

BertAdam (torch_npu's NpuFusedBertAdam, a port of HF's BertAdam) likewise:

  bert_adam_reference        tools/bert_adam_reference.py, NpuFusedBertAdam's formulas in torch ops (the
                             reference of FusedBertAdam; it clips .grad in place per (group, dtype))
  hf_bert_adam               HF pytorch-pretrained-bert 0.6.2's BertAdam: per-param clipping (clip_grad_norm_
                             of each param, in place), so it is timed, not compared.

With --deepspeed (adam, adamw), DeepSpeed's CPU Adam runs beside them (deepspeed.ops.adam.DeepSpeedCPUAdam,
the fused CPU Adam of ZeRO-Offload; not installed by scripts/setup: `pip install deepspeed` into .venv,
and its first use compiles it, about a minute). Give OMP_NUM_THREADS as --threads: it runs on its own
OpenMP runtime.

Before timing, every impl takes 3 steps and is compared with torch_forloop (a warning, not an
error, if they disagree). Then come --warmup steps and --rounds rounds; each round steps every impl
once, in an order that rotates from round to round so that drift in machine load is spread evenly.
A round during which other processes took more than --disturbed-share of the machine's CPU time
(bench/load_monitor.py) is thrown away and repeated, at most --max-discards times per run; the
report says how many were, and how many disturbed rounds had to be kept. Each ratio comes with its
spread: the quartiles of the per-round ratios, and with --runs N (N fresh runs) the range of the
N runs' median ratios, which is what the README's tables show.

  scripts/bench-torch --optimizer adamw --shapes mobilenet_v1 --json out.json
  scripts/bench-torch --optimizer sgd --numel 10000000 --dtype bf16 --threads 2
  scripts/bench-torch --all --json-dir bench-results/torch     # Markdown table for the README
  scripts/bench-torch --optimizer sgd --shapes mobilenet_v1 --runs 3 --json sgd.json  # spread over 3 runs
  scripts/bench-torch --markdown sgd.json adamw.json       # their Markdown table (the README's rows)
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time

import fusedopt
from fusedopt import _C

import torch

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
import gen_model_shapes  # noqa: E402  (tools/ is not a package)
from load_monitor import DEFAULT_SHARE, LoadMonitor, timed_rounds  # noqa: E402  (bench/ is this file's folder)
from torch_bench_references import BENCH_KWARGS, LR, REFERENCES, deepspeed_references  # noqa: E402


def torch_twin(cls: type) -> type | None:
    """The torch.optim class a fusedopt class is a drop-in for (its base), or None."""
    return next((base for base in cls.__mro__[1:] if base.__module__.split(".")[:2] == ["torch", "optim"]
                 and base is not torch.optim.Optimizer), None)


def fused_classes() -> dict[str, type]:
    """--optimizer -> fusedopt class, read from the package: a drop-in is named after its torch twin
    (adamw, radam), the others after their engine algorithm (lion, bert_adam); the drop-ins first,
    each part in the engine's registry order."""
    classes = [getattr(fusedopt, name) for name in fusedopt.__all__]
    named = {(twin.__name__.lower() if (twin := torch_twin(c)) else c._algorithm): c
             for c in classes if isinstance(c, type) and hasattr(c, "_algorithm")}
    order = {name: i for i, name in enumerate(fusedopt._C.algorithms)}
    return dict(sorted(named.items(), key=lambda kv: (torch_twin(kv[1]) is None, order.get(kv[0], len(order)))))


FUSED_CLASSES = fused_classes()
# --optimizer -> (torch.optim class name, arguments beyond lr; torch's defaults otherwise)
TORCH_OPTIMIZERS = {name: (torch_twin(cls).__name__, BENCH_KWARGS.get(name, {}))
                    for name, cls in FUSED_CLASSES.items() if torch_twin(cls) is not None}
OPTIMIZERS = tuple(FUSED_CLASSES)
# another formula (or grads rewritten)
UNCOMPARED = {"pytorch_optimizer", "pytorch_optimizer_foreach", "larc_sgd", "hf_bert_adam"}
MODELS = {name: constructor for name, constructor, _, _ in gen_model_shapes.MODELS}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TORCH_IMPLS = ("torch_forloop", "torch_foreach", "torch_fused")
FUSEDOPT_IMPLS = ("fused", "fused_flat")
NO_FLATTEN = ("adafactor",)  # timed without flatten=True (measured before FusedAdafactor took it; docs/benchmarks.md)


def fused_impls(optimizer: str) -> tuple[str, ...]:
    """The fusedopt impls timed for an optimizer: fused, and fused_flat where it takes flatten=True."""
    return ("fused",) if optimizer in NO_FLATTEN else FUSEDOPT_IMPLS
ENGINE = "engine"

SEED = 0
CHECK_STEPS = 3
# Bound on compare()'s relative diff: f32 impls differ by rounding only; 16-bit params are rounded
# every step and torch's own impls already differ from one another by an ulp or so.
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 8.0, torch.float16: 8.0}
BIG_NUMEL = 50_000_000  # bert_base, gpt2_small: default 5 rounds instead of 15, progress per round
DEFAULT_ROUNDS, DEFAULT_ROUNDS_BIG = 15, 5


# ---------------------------------------------------------------------------------- setup


def tensor_shapes(shapes: str | None, numel: int | None) -> list[tuple[int, ...]]:
    """Per-tensor shapes of a model (as model.parameters() yields them) or one flat tensor."""
    if numel is not None:
        return [(numel,)]
    return [dims for _, dims, _ in gen_model_shapes.collect(MODELS[shapes])]


def make_params(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Params and their grads from randn with a fixed seed: every call returns the same values."""
    gen = torch.Generator().manual_seed(SEED)
    params = []
    for dims in shapes:
        p = torch.randn(dims, generator=gen, dtype=dtype).requires_grad_()
        p.grad = torch.randn(dims, generator=gen, dtype=dtype)
        params.append(p)
    return params


def torch_fused_supported(optimizer: str, dtype: torch.dtype) -> bool:
    """Whether torch.optim.<X>(fused=True) accepts CPU params of `dtype` and can step them."""
    name, kwargs = TORCH_OPTIMIZERS[optimizer]
    p = torch.zeros(4, dtype=dtype, requires_grad=True)
    p.grad = torch.ones(4, dtype=dtype)
    try:
        getattr(torch.optim, name)([p], lr=LR, fused=True, **kwargs).step()
    except (TypeError, RuntimeError, ValueError):
        return False
    return True


def references(optimizer: str, dtype: torch.dtype, deepspeed: bool = False) -> dict:
    """The reference impls of an optimizer: name -> constructor(params); the first is the one the
    others are checked against. torch_fused is left out where torch has no such kernel."""
    if deepspeed:
        return references(optimizer, dtype) | deepspeed_references(optimizer)
    if optimizer in REFERENCES:
        return REFERENCES[optimizer]()
    name, kwargs = TORCH_OPTIMIZERS[optimizer]
    variants = {"torch_forloop": {"foreach": False}, "torch_foreach": {"foreach": True}}
    if torch_fused_supported(optimizer, dtype):
        variants["torch_fused"] = {"fused": True}
    return {impl: (lambda params, v=v: getattr(torch.optim, name)(params, lr=LR, **kwargs, **v))
            for impl, v in variants.items()}


def build_fused(optimizer: str, params: list[torch.Tensor], flatten: bool) -> torch.optim.Optimizer:
    """fusedopt's class with the reference's arguments (RMSpropTF, AdamP, BertAdam: their defaults)."""
    return FUSED_CLASSES[optimizer](params, lr=LR, flatten=flatten, **BENCH_KWARGS.get(optimizer, {}))


class EngineOnly:
    """The `engine` impl: the engine's step on the segments of a Fused<X> that has stepped (its
    tensors and grads: the bench never replaces them), as a function of no arguments
    (_C.PreparedStep.bound): one call into C++ and no Python work."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.param_groups = optimizer.param_groups
        packed = optimizer._pack(optimizer._group_hypers(), [])
        prepared = type(optimizer)._engine_prepare(packed.hypers, _C.SegmentTable(packed.rows))
        self.step = prepared.bound(packed.grads, packed.codes, 1.0, torch.get_num_threads(), optimizer._max_grad_norm,
                                   optimizer._norm_code, optimizer._clip_rule)


def params_of(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


# ------------------------------------------------------------------------------ measuring


def compare(param: torch.Tensor, reference: torch.Tensor,
            initial: torch.Tensor) -> tuple[float, int]:
    """(relative diff, count of elements finite in one and not in the other). The relative diff is
    max |param - reference| / max(max |reference - initial|, one ulp at max |reference|) over the
    elements finite in both: about 1 for a wrong update, whatever the dtype."""
    param, reference, initial = param.float(), reference.float(), initial.float()
    finite = reference.isfinite()
    mismatches = int((finite != param.isfinite()).sum())
    both = finite & param.isfinite()
    if not both.any():
        return 0.0, mismatches
    diff = (param - reference)[both].abs().max().item()
    update = (reference - initial)[both].abs().max().item()
    ulp = torch.finfo(initial.dtype).eps * reference[both].abs().max().item()
    return (diff / max(update, ulp) if diff > 0.0 else 0.0), mismatches


def check_agreement(optimizers: dict, dtype: torch.dtype) -> dict[str, dict]:
    """Steps every impl CHECK_STEPS times from identical params and grads and compares its params
    with the first impl's (the reference: torch_forloop, lion_pytorch, lamb_reference, lars_reference,
    rmsproptf_reference, adamp); warns on
    stderr where the relative diff exceeds CHECK_TOLERANCE, where inf/nan sit elsewhere, or where
    the reference's own params are no longer finite."""
    first = next(iter(optimizers))
    initial = [p.detach().clone() for p in params_of(optimizers[first])]
    for opt in optimizers.values():
        for _ in range(CHECK_STEPS):
            opt.step()
    reference = [p.detach() for p in params_of(optimizers[first])]
    non_finite = sum(int((~p.isfinite()).sum()) for p in reference)
    if non_finite:
        print(f"WARNING: after {CHECK_STEPS} steps in {dtype}, {non_finite:,} of {first}'s "
              f"params are inf/nan; the timings run on them", file=sys.stderr)
    checks = {}
    for impl, opt in optimizers.items():
        if impl in UNCOMPARED:
            checks[impl] = None
            continue
        pairs = [compare(p.detach(), ref, p0)
                 for p, ref, p0 in zip(params_of(opt), reference, initial)]
        diff, mismatches = max(d for d, _ in pairs), sum(m for _, m in pairs)
        checks[impl] = {"max_rel_diff": diff, "non_finite_mismatches": mismatches}
        if diff > CHECK_TOLERANCE[dtype] or mismatches:
            print(f"WARNING: {impl} differs from {first} after {CHECK_STEPS} steps: max diff "
                  f"{diff:.3g} x the update (tolerance {CHECK_TOLERANCE[dtype]:g}), {mismatches:,} "
                  f"params finite in one and inf/nan in the other", file=sys.stderr)
    return checks


def time_steps(optimizers: dict, warmup: int, rounds: int, progress: bool, monitor: LoadMonitor,
               max_discards: int) -> tuple[dict[str, list[float]], dict]:
    """Milliseconds of each optimizer.step(), `rounds` quiet rounds per impl, impls interleaved in
    rotating order; disturbed rounds are repeated (load_monitor.timed_rounds). Returns the samples and
    the rounds' load report; with `progress`, one line per round on stderr."""
    names = list(optimizers)
    for _ in range(warmup):
        for name in names:
            optimizers[name].step()

    def one_round(r: int) -> dict[str, float]:
        shift = r % len(names)
        ms = {}
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            optimizers[name].step()
            ms[name] = (time.perf_counter() - start) * 1e3
        if progress:
            line = ", ".join(f"{name} {ms[name]:.1f}" for name in names)
            print(f"  round {r + 1}/{rounds} (ms): {line}", file=sys.stderr)
        return ms

    kept = timed_rounds(one_round, rounds, monitor, max_discards)
    print(f"  {kept.describe()}", file=sys.stderr)
    return {name: [ms[name] for ms in kept.results] for name in names}, kept.report()


def summary(samples: list[float]) -> dict:
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "samples_ms": samples}


def spread(values: list[float]) -> dict:
    """min, quartiles and max of a list (one value: all five are it)."""
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"min": min(values), "q1": q1, "median": median, "q3": q3, "max": max(values)}


def round_ratios(results: dict, best: str) -> dict:
    """Per reference impl, the spread of its per-round ratio to the best fusedopt impl's step (both
    stepped in the same round, so a round's load affects both)."""
    fused = results[best]["samples_ms"]
    return {impl: spread([x / f for x, f in zip(r["samples_ms"], fused)])
            for impl, r in results.items() if r is not None and impl not in (*FUSEDOPT_IMPLS, ENGINE)}


def run(optimizer: str, shapes: str | None, numel: int | None, dtype_name: str, rounds: int | None,
        warmup: int, deepspeed: bool = False, monitor: LoadMonitor | None = None,
        max_discards: int | None = None) -> dict:
    """Benchmarks one optimizer on one shape set; returns the JSON result. All tensors are freed
    before it returns. Disturbed rounds are repeated up to `max_discards` times (default: `rounds`)."""
    dtype = DTYPES[dtype_name]
    dims = tensor_shapes(shapes, numel)
    total = sum(torch.Size(d).numel() for d in dims)
    if rounds is None:
        rounds = DEFAULT_ROUNDS_BIG if total > BIG_NUMEL else DEFAULT_ROUNDS
    refs = references(optimizer, dtype, deepspeed)
    shapes_name = shapes or "flat"
    print(f"{optimizer} on {shapes_name}: {len(dims)} tensors, {total:,} params, {dtype_name}, "
          f"{torch.get_num_threads()} threads, {rounds} rounds", file=sys.stderr)
    optimizers = {impl: make(make_params(dims, dtype)) for impl, make in refs.items()}
    for impl in fused_impls(optimizer):
        optimizers[impl] = build_fused(optimizer, make_params(dims, dtype), impl == "fused_flat")
    checks = check_agreement(optimizers, dtype)
    # The engine on fused's own tensors, so that fused / engine - 1 is what the Python side costs: two impls of
    # tensors of their own differ by a few % with where these lie. Made after the check, which steps each impl
    # apart, and timed second, so that rotating never runs it right after fused (its tensors then warm).
    order = list(optimizers)
    optimizers = {impl: optimizers[impl] for impl in order[:1]} | {ENGINE: EngineOnly(optimizers["fused"])} | {
        impl: optimizers[impl] for impl in order[1:]}
    checks[ENGINE] = checks["fused"]  # (its tensors')
    samples, load = time_steps(optimizers, warmup, rounds, total > BIG_NUMEL, monitor or LoadMonitor(),
                               rounds if max_discards is None else max_discards)
    del optimizers
    gc.collect()  # fused_flat's store and its optimizer reference each other

    # torch's three impls are always listed (null: no fused=True kernel), as the README tables expect.
    results = {impl: None for impl in TORCH_IMPLS} if optimizer in TORCH_OPTIMIZERS else {}
    for impl in optimizers_order(refs, optimizer):
        results[impl] = summary(samples[impl]) | {"check_vs_reference": checks[impl]}
    best_impl = min(fused_impls(optimizer), key=lambda i: results[i]["median_ms"])
    best = results[best_impl]["median_ms"]
    engine = results[ENGINE]["median_ms"]
    return {
        "optimizer": optimizer, "shapes": shapes_name, "tensors": len(dims), "numel": total,
        "dtype": dtype_name, "threads": torch.get_num_threads(), "rounds": rounds, "warmup": warmup,
        "torch_version": torch.__version__, "target": fusedopt.active_target(), "impls": results,
        **{f"speedup_vs_{impl}": None if r is None else r["median_ms"] / best
           for impl, r in results.items() if impl not in (*FUSEDOPT_IMPLS, ENGINE)},
        "round_ratio_spread": round_ratios(results, best_impl), "load": load,
        "dropin_overhead": results["fused"]["median_ms"] / engine - 1.0,
        # fused / engine - 1 of each round (both stepped in it)
        "dropin_overhead_spread": spread([f / e - 1.0 for f, e in zip(results["fused"]["samples_ms"],
                                                                        results[ENGINE]["samples_ms"])]),
    }


def run_repeated(runs: int, *args, **kwargs) -> dict:
    """`runs` fresh runs of run(); the last run's result with, per speedup, the spread of the runs'
    values ("runs": the per-run values) and the runs' discarded-round counts."""
    results = [run(*args, **kwargs) for _ in range(runs)]
    last = dict(results[-1])
    keys = [k for k, v in last.items() if k.startswith("speedup_vs_") and v is not None]
    last["runs"] = {"count": runs, "discarded": [r["load"]["discarded"] for r in results],
                    "disturbed_kept": [r["load"]["disturbed_kept"] for r in results],
                    **{k: spread([r[k] for r in results]) | {"values": [r[k] for r in results]} for k in keys}}
    return last


def optimizers_order(refs: dict, optimizer: str) -> list[str]:
    return list(refs) + list(fused_impls(optimizer)) + [ENGINE]


# -------------------------------------------------------------------------------- reports


def fusedopt_best_ms(result: dict) -> float:
    return min(result["impls"][i]["median_ms"] for i in FUSEDOPT_IMPLS if i in result["impls"])


def text_table(result: dict) -> str:
    best = fusedopt_best_ms(result)
    width = max(15, *(len(impl) + 2 for impl in result["impls"]))
    lines = [f"{result['optimizer']} on {result['shapes']} ({result['tensors']} tensors, "
             f"{result['numel']:,} params, {result['dtype']}, {result['threads']} threads, "
             f"{result['target']}, torch {result['torch_version']})",
             f"{'impl':<{width}}{'median ms':>11}{'min ms':>11}{'fusedopt speedup':>18}"]
    for impl, r in result["impls"].items():
        if r is None:
            lines.append(f"{impl:<{width}}  n/a: torch {result['torch_version']} has no fused=True CPU "
                         f"kernel for this optimizer")
        else:
            lines.append(f"{impl:<{width}}{r['median_ms']:>11.3f}{r['min_ms']:>11.3f}"
                         f"{r['median_ms'] / best:>17.2f}x")
    s = result["dropin_overhead_spread"]
    lines.append(f"drop-in overhead (fused / engine - 1): {result['dropin_overhead']:+.1%}; per round "
                 f"{s['min']:+.1%} [{s['q1']:+.1%} {s['median']:+.1%} {s['q3']:+.1%}] {s['max']:+.1%}")
    load = result["load"]
    lines.append(f"rounds: {load['kept']} kept, {load['discarded']} thrown away as disturbed, "
                 f"{load['disturbed_kept']} disturbed kept; load average {load['loadavg_min']:.2f}-"
                 f"{load['loadavg_max']:.2f}")
    if result.get("runs", {}).get("count", 1) > 1:
        runs = result["runs"]
        lines.append(f"over {runs['count']} runs: thrown away {'+'.join(map(str, runs['discarded']))}, "
                     f"disturbed kept {'+'.join(map(str, runs['disturbed_kept']))}")
    for impl, s in result["round_ratio_spread"].items():
        line = f"speedup vs {impl}: per round {s['min']:.2f} [{s['q1']:.2f} {s['median']:.2f} {s['q3']:.2f}] {s['max']:.2f}"
        if result.get("runs", {}).get("count", 1) > 1:
            r = result["runs"][f"speedup_vs_{impl}"]
            line += (f"; over {result['runs']['count']} runs: median {r['median']:.2f}x, "
                     f"min {r['min']:.2f}x, max {r['max']:.2f}x")
        lines.append(line)
    return "\n".join(lines)


def markdown_table(results: list[dict]) -> str:
    """The README's table: medians, and each speedup with its spread: the median and range over the
    runs with --runs N > 1, else the per-round ratios' median and quartiles."""
    def ms(r):
        return "n/a" if r is None else f"{r['median_ms']:.2f}"

    def speedup(result, impl):
        x = result[f"speedup_vs_{impl}"]
        if x is None:
            return "n/a"
        if "runs" in result and result["runs"]["count"] > 1:
            s = result["runs"][f"speedup_vs_{impl}"]
            return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"
        s = result["round_ratio_spread"][impl]  # one run: the per-round ratios' median and quartiles
        return f"{s['median']:.2f}x ({s['q1']:.2f}-{s['q3']:.2f})"

    lines = ["| optimizer | shapes | fusedopt best ms | torch for-loop ms | foreach ms "
             "| fused=True ms | vs for-loop | vs foreach | vs fused=True | rounds thrown away |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in results:
        i = r["impls"]
        discarded = r["runs"]["discarded"] if "runs" in r else [r["load"]["discarded"]]
        lines.append(f"| {r['optimizer']} | {r['shapes']} | {fusedopt_best_ms(r):.2f} "
                     f"| {ms(i['torch_forloop'])} | {ms(i['torch_foreach'])} "
                     f"| {ms(i['torch_fused'])} | {speedup(r, 'torch_forloop')} "
                     f"| {speedup(r, 'torch_foreach')} | {speedup(r, 'torch_fused')} "
                     f"| {'+'.join(map(str, discarded))} |")
    return "\n".join(lines)


def write_json(result: dict, path: pathlib.Path) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.resolve()}", file=sys.stderr)  # relative paths are the caller's


# ----------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", choices=OPTIMIZERS)
    parser.add_argument("--shapes", choices=MODELS, help="a model's per-tensor parameter shapes")
    parser.add_argument("--numel", type=int, help="one flat tensor of NUMEL elements instead")
    parser.add_argument("--dtype", choices=DTYPES, default="f32", help="of params and grads")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--rounds", type=int,
                        help=f"timed steps per impl (default {DEFAULT_ROUNDS}, or "
                             f"{DEFAULT_ROUNDS_BIG} above {BIG_NUMEL:,} params)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per impl (default 3)")
    parser.add_argument("--json", type=pathlib.Path, help="write the result here")
    parser.add_argument("--deepspeed", action="store_true",
                        help="adam, adamw: also time DeepSpeed's CPU Adam (pip install deepspeed)")
    parser.add_argument("--all", action="store_true",
                        help="every torch.optim optimizer on every model; prints a Markdown table")
    parser.add_argument("--json-dir", type=pathlib.Path,
                        help="with --all: one OPTIMIZER_SHAPES.json per run here")
    parser.add_argument("--runs", type=int, default=1,
                        help="fresh runs per optimizer and shapes; the speedups' spread over them (default 1)")
    parser.add_argument("--max-discards", type=int,
                        help="disturbed rounds thrown away and repeated per run at most (default: --rounds)")
    parser.add_argument("--disturbed-share", type=float, default=DEFAULT_SHARE,
                        help="a round is disturbed when other processes took more than this share of the "
                             f"machine's CPU time during it (default {DEFAULT_SHARE})")
    parser.add_argument("--markdown", type=pathlib.Path, nargs="+", metavar="JSON",
                        help="print the Markdown table of these --json results, nothing run")
    args = parser.parse_args()
    if args.markdown:
        return args
    if args.all:
        if args.optimizer or args.shapes or args.numel is not None or args.json or args.deepspeed:
            parser.error("--all runs every optimizer and shape set: "
                         "no --optimizer/--shapes/--numel/--json/--deepspeed with it")
    else:
        if args.optimizer is None or (args.shapes is None) == (args.numel is None) or args.json_dir:
            parser.error("give --optimizer and one of --shapes/--numel, or --all "
                         "(--json-dir goes with --all)")
        if args.deepspeed and args.optimizer not in ("adam", "adamw"):
            parser.error("--deepspeed goes with --optimizer adam or adamw")
    for name, low in (("numel", 1), ("threads", 1), ("rounds", 1), ("warmup", 0), ("runs", 1),
                      ("max_discards", 0)):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}")
    if not 0.0 < args.disturbed_share <= 1.0:
        parser.error(f"--disturbed-share must be in (0, 1], got {args.disturbed_share}")
    return args


def main() -> None:
    args = parse_args()
    if args.markdown:
        print(markdown_table([json.loads(path.read_text(encoding="utf-8")) for path in args.markdown]))
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    monitor = LoadMonitor(args.disturbed_share)
    timing = {"monitor": monitor, "max_discards": args.max_discards}
    if not args.all:
        result = run_repeated(args.runs, args.optimizer, args.shapes, args.numel, args.dtype, args.rounds,
                              args.warmup, args.deepspeed, **timing)
        print(text_table(result))
        if args.json:
            write_json(result, args.json)
        return
    if args.json_dir:
        args.json_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for shapes in MODELS:
        for optimizer in TORCH_OPTIMIZERS:
            result = run_repeated(args.runs, optimizer, shapes, None, args.dtype, args.rounds, args.warmup,
                                  **timing)
            print(text_table(result), file=sys.stderr)
            if args.json_dir:
                write_json(result, args.json_dir / f"{optimizer}_{shapes}.json")
            results.append(result)
    print(markdown_table(results))


if __name__ == "__main__":
    main()
