"""End-to-end training step: fusedopt vs torch.optim in a real PyTorch loop (issue #5).

Every implementation trains its own deep copy of ONE model initialisation on the SAME batches with
fusedopt.Trainer (forward, backward, optimizer; + clip_grad_norm_ with --clip):

  torch        torch.optim.<X>(foreach=False), the for-loop (one Python-dispatched op per tensor per
               elementary operation)
  foreach      torch.optim.<X>(foreach=True)
  torch_fused  torch.optim.<X>(fused=True), where torch 2.13 has a CPU kernel (not RMSprop)
  fused        fusedopt.Fused<X> (clipping inside the step)

The impls run alternately, step by step in one process (step i of every impl, the order rotating
each step), so machine noise is common-mode. Means are over the steps after --warmup. The table
ends with the Amdahl bound from the for-loop's own split — a step can get at most
step / (step - optimizer) faster by speeding up the optimizer alone — and the share of it fusedopt
captures: (speedup - 1) / (bound - 1). Table columns are trimmed means over the timed steps (10 % dropped at each end), except
`total s`: the impl's own training time, warm-up steps included. The first 10 losses of every impl
are compared with the for-loop's (max relative difference printed under the table).

  scripts/bench-train --model transformer_small --optimizer adamw --steps 30
  scripts/bench-train --model mobilenet_v1 --optimizer sgd --json r.json --chart r.png --trace t.json
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import sys
import time

import torch

import fusedopt
from fusedopt.progress import ProgressBar
from fusedopt.timeline import Tracer
from fusedopt.trainer import Trainer, optimizer_label, summarize

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "bench"))
sys.path.insert(0, str(REPO_ROOT / "tools"))
import train_chart  # noqa: E402  (tools/ is not a package)
import train_models  # noqa: E402
from load_monitor import LoadMonitor  # noqa: E402

# --optimizer -> (torch.optim class name, its arguments)
OPTIMIZERS = {
    "sgd": ("SGD", {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4}),
    "adamw": ("AdamW", {"lr": 1e-3, "weight_decay": 1e-2}),
    "adam": ("Adam", {"lr": 1e-3}),
    "rmsprop": ("RMSprop", {"lr": 1e-3}),
    "adagrad": ("Adagrad", {"lr": 1e-2}),
}
IMPLS = ("torch", "foreach", "torch_fused", "fused")
TORCH_VARIANTS = {"torch": {"foreach": False}, "foreach": {"foreach": True}, "torch_fused": {"fused": True}}
LOSS_CHECK_STEPS = 10
SEED = 0


# ---------------------------------------------------------------------------------- setup


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(SEED)
    if args.model == "transformer_small":
        return train_models.transformer_small(args.vocab, args.seq_len, args.d_model, args.n_layer, args.n_head)
    return train_models.MODELS[args.model](args.num_classes)


def make_pool(args: argparse.Namespace) -> list:
    if args.model == "transformer_small":
        return train_models.token_batches(args.pool, args.batch_size, args.seq_len, args.vocab, SEED)
    if args.dataset == "digits":
        return train_models.digits_batches(args.pool, args.batch_size, args.image_size, SEED)
    return train_models.image_batches(args.pool, args.batch_size, args.image_size, args.num_classes, SEED)


def make_optimizer(impl: str, optimizer: str, params, clip: float | None) -> torch.optim.Optimizer:
    name, kwargs = OPTIMIZERS[optimizer]
    if impl == "fused":
        return getattr(fusedopt, "Fused" + name)(params, max_grad_norm=clip, **kwargs)
    return getattr(torch.optim, name)(params, **kwargs, **TORCH_VARIANTS[impl])


def torch_fused_supported(optimizer: str) -> bool:
    """Whether torch.optim.<X>(fused=True) can step f32 CPU params (torch 2.13: not RMSprop)."""
    p = torch.zeros(4, requires_grad=True)
    p.grad = torch.ones(4)
    try:
        make_optimizer("torch_fused", optimizer, [p], None).step()
    except (TypeError, RuntimeError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------ measuring


def run(args: argparse.Namespace) -> dict:
    """Trains every impl (alternating step by step) and returns the JSON report."""
    impls = [i for i in args.impls if i != "torch_fused" or torch_fused_supported(args.optimizer)]
    for skipped in set(args.impls) - set(impls):
        print(f"note: torch {torch.__version__} has no fused=True CPU kernel for {args.optimizer}; "
              f"skipping {skipped}", file=sys.stderr)
    model = make_model(args)
    pool = make_pool(args)
    loss_fn = train_models.lm_loss if args.model == "transformer_small" else torch.nn.functional.cross_entropy
    tracer = Tracer() if args.trace else None
    trainers = {}
    for impl in impls:
        replica = copy.deepcopy(model)
        opt = make_optimizer(impl, args.optimizer, replica.parameters(), args.clip)
        trainers[impl] = Trainer(replica, loss_fn, opt, max_grad_norm=args.clip, progress=False, trace=tracer,
                                 name=args.model)
    batches = {impl: train_models.cycle(pool) for impl in impls}
    numel = sum(p.numel() for p in model.parameters())
    total = args.warmup + args.steps
    print(f"{args.model}: {len(list(model.parameters()))} tensors, {numel:,} params; {args.optimizer}, batch "
          f"{args.batch_size}, {torch.get_num_threads()} threads; {args.warmup} warm-up + {args.steps} timed "
          f"steps of {', '.join(impls)}", file=sys.stderr)
    records = {impl: [] for impl in impls}
    bar = ProgressBar(total, "steps")
    # Without a terminal, a plain line every ~10 % of the run instead of the bar.
    every = 0 if bar.enabled else max(1, total // 10)
    # Training steps cannot be repeated (every impl must see the same batches in the same order), so
    # steps that other processes disturbed are counted and reported, not thrown away (bench/load_monitor.py).
    monitor, disturbed = LoadMonitor(), 0
    for step in range(total):
        shift = step % len(impls)
        monitor.begin()
        for impl in impls[shift:] + impls[:shift]:
            records[impl].append(trainers[impl].train_step(batches[impl], warmup=step < args.warmup))
        if monitor.end().disturbed and step >= args.warmup:
            disturbed += 1
        text = "  ".join(f"{impl} {records[impl][-1]['step_ms']:.0f}ms" for impl in impls)
        bar.update(step + 1, text)
        if every and ((step + 1) % every == 0 or step + 1 == total):
            print(f"  step {step + 1}/{total}: {text}", file=sys.stderr)
    bar.close(total)
    if tracer is not None:
        tracer.other_data.update(trainers[impls[0]].trace_info())
        tracer.write(args.trace)
    return report(args, trainers, records) | {"disturbed_steps": disturbed}


def report(args: argparse.Namespace, trainers: dict, records: dict) -> dict:
    impls = {}
    for impl, recs in records.items():
        s = summarize(recs, sum(r["step_ms"] for r in recs) / 1e3)
        impls[impl] = {"label": optimizer_label(trainers[impl].optimizer), "samples_per_s": s["samples_per_s"],
                       "step_ms": s["step_ms"], "optimizer_ms": s["optimizer_ms"],
                       "optimizer_share": s["optimizer_ms"] / s["step_ms"], "total_s": s["total_s"],
                       "phases_ms": s["phases_ms"], "losses": s["losses"]}
    result = {"model": args.model, "optimizer": args.optimizer, "batch_size": args.batch_size,
              "threads": torch.get_num_threads(), "steps": args.steps, "warmup": args.warmup,
              "clip": args.clip, "torch_version": torch.__version__, "target": fusedopt.active_target(),
              "impls": impls}
    return result | gains(impls) | {"max_loss_rel_diff_first10": loss_agreement(impls),
                                    "model_ms_spread": model_spread(impls)}


def gains(impls: dict) -> dict:
    """speedup = torch.step_ms / fused.step_ms; amdahl_bound = torch.step_ms / (torch.step_ms -
    torch.optimizer_ms); bound_gain_captured = (speedup - 1) / (amdahl_bound - 1). None where an
    impl is missing (or the for-loop optimizer takes no time)."""
    torch_r, fused_r = impls.get("torch"), impls.get("fused")
    speedup = bound = captured = None
    if torch_r is not None:
        rest = torch_r["step_ms"] - torch_r["optimizer_ms"]
        bound = torch_r["step_ms"] / rest if rest > 0 else None
        if fused_r is not None:
            speedup = torch_r["step_ms"] / fused_r["step_ms"]
            if bound is not None and bound > 1.0:
                captured = (speedup - 1.0) / (bound - 1.0)
    # The same ratio with the model's time taken from the for-loop run for both: only the measured
    # optimizer phases differ, so forward/backward noise (see model_spread) cancels.
    phase_speedup = phase_captured = None
    if torch_r is not None and fused_r is not None and bound is not None and bound > 1.0:
        phase_speedup = torch_r["step_ms"] / (torch_r["step_ms"] - torch_r["optimizer_ms"] + fused_r["optimizer_ms"])
        phase_captured = (phase_speedup - 1.0) / (bound - 1.0)
    return {"speedup": speedup, "amdahl_bound": bound, "bound_gain_captured": captured,
            "phase_speedup": phase_speedup, "phase_gain_captured": phase_captured}


def model_spread(impls: dict) -> float:
    """(max - min) / min of the impls' forward + backward ms. The model's work is the same
    for every impl, so this is the run's noise floor: a speedup smaller than it is not resolved."""
    model_ms = [r["phases_ms"]["forward"] + r["phases_ms"]["backward"] for r in impls.values()]
    return (max(model_ms) - min(model_ms)) / min(model_ms)


def loss_agreement(impls: dict) -> float:
    """Max |loss - reference loss| / |reference loss| over the first 10 steps of every impl; the
    reference is the for-loop (or the first impl)."""
    ref = (impls.get("torch") or next(iter(impls.values())))["losses"][:LOSS_CHECK_STEPS]
    worst = 0.0
    for r in impls.values():
        for a, b in zip(r["losses"][:LOSS_CHECK_STEPS], ref):
            worst = max(worst, abs(a - b) / max(abs(b), 1e-30))
    return worst


# -------------------------------------------------------------------------------- reports


def table_rows(result: dict) -> list[list[str]]:
    base = result["impls"].get("torch", {}).get("step_ms")
    rows = []
    for impl, r in result["impls"].items():
        speedup = f"{base / r['step_ms']:.2f}x" if base else "n/a"
        rows.append([f"{impl}: {r['label']}", f"{r['samples_per_s']:.1f}", f"{r['step_ms']:.2f}",
                     f"{r['optimizer_ms']:.2f}", f"{100 * r['optimizer_share']:.1f} %", f"{r['total_s']:.2f}", speedup])
    return rows


HEADER = ["impl", "samples/s", "step ms", "optimizer ms", "optimizer share", "total s", "speedup vs torch for-loop"]


def title(result: dict) -> str:
    clip = f", clip {result['clip']:g}" if result["clip"] is not None else ""
    return (f"{result['model']} / {result['optimizer']}{clip}, batch {result['batch_size']}, {result['threads']} "
            f"threads, {result['steps']} timed steps (+{result['warmup']} warm-up), torch {result['torch_version']}, "
            f"{result['target']}")


def bound_line(result: dict) -> str:
    if result["amdahl_bound"] is None:
        return "Amdahl bound: n/a (needs the torch for-loop impl)"
    line = f"Amdahl bound (torch for-loop): {result['amdahl_bound']:.3f}x"
    if result["speedup"] is not None:
        captured = result["bound_gain_captured"]
        line += (f"; fusedopt speedup {result['speedup']:.3f}x captures "
                 + ("n/a" if captured is None else f"{100 * captured:.0f} %") + " of the bound gain")
        if result["phase_gain_captured"] is not None:
            line += (f" (from the optimizer phases alone, model time held equal: "
                     f"{100 * result['phase_gain_captured']:.0f} %)")
    diff = result["max_loss_rel_diff_first10"]
    if result.get("disturbed_steps"):
        line += (f"\n{result['disturbed_steps']} of {result['steps']} timed steps were disturbed by other processes "
                 "(docs/benchmarks.md, \"Load\"): these times are not the code's alone")
    return (line + f"\nmax loss rel diff over the first {LOSS_CHECK_STEPS} steps: {diff:.2e}; forward+backward "
            f"times differ by {100 * result['model_ms_spread']:.1f} % across impls (the noise floor)")


def text_table(result: dict) -> str:
    rows = [HEADER] + table_rows(result)
    widths = [max(len(row[c]) for row in rows) for c in range(len(HEADER))]
    lines = [title(result)]
    for i, row in enumerate(rows):
        cells = [cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells))
    return "\n".join(lines + [bound_line(result)])


def markdown_table(result: dict) -> str:
    lines = [f"**{title(result)}**", "", "| " + " | ".join(HEADER) + " |",
             "|---|" + "--:|" * (len(HEADER) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    return "\n".join(lines + ["", bound_line(result).replace("\n", "  \n"), ""])


# ----------------------------------------------------------------------------------- main


def impl_list(text: str, impls=IMPLS) -> list[str]:
    """--impls: comma-separated names of `impls`, each once, in the order given."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in impls]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--impls: unknown {bad or text!r}; choose from {','.join(impls)}")
    return list(dict.fromkeys(names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=train_models.MODELS, default="mobilenet_v1")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument("--impls", type=impl_list, default=list(IMPLS), help="comma-separated (default: all)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32, help="image models (default 32)")
    # --classes and --data: `fusedopt train`'s older spellings, accepted here too.
    parser.add_argument("--num-classes", "--classes", type=int, help="image models (default 1000; digits: 10)")
    parser.add_argument("--dataset", "--data", choices=("synthetic", "digits"), default="synthetic",
                        help="image models")
    parser.add_argument("--vocab", type=int, default=1024, help="transformer_small")
    parser.add_argument("--seq-len", type=int, default=64, help="transformer_small")
    parser.add_argument("--d-model", type=int, default=128, help="transformer_small")
    parser.add_argument("--n-layer", type=int, default=8, help="transformer_small")
    parser.add_argument("--n-head", type=int, default=4, help="transformer_small")
    parser.add_argument("--pool", type=int, default=8, help="distinct batches, cycled (default 8)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per impl (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per impl first (default 3)")
    parser.add_argument("--clip", type=float, help="clip the global grad norm to this (default: no clipping)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--json", type=pathlib.Path, help="write the report here")
    parser.add_argument("--markdown", type=pathlib.Path, help="write the table here as Markdown")
    parser.add_argument("--chart", type=pathlib.Path, help="PNG of the per-phase breakdown")
    parser.add_argument("--trace", type=pathlib.Path, help="Chrome trace-event JSON (docs/trace-format.md)")
    args = parser.parse_args(argv)
    for name, low in (("batch_size", 1), ("image_size", 8), ("num_classes", 2), ("vocab", 2), ("seq_len", 1),
                      ("d_model", 1), ("n_layer", 1), ("n_head", 1), ("pool", 1), ("steps", 1), ("warmup", 0),
                      ("threads", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if args.clip is not None and not args.clip > 0:
        parser.error(f"--clip must be positive, got {args.clip}")
    if args.num_classes is None:
        args.num_classes = 10 if args.dataset == "digits" else 1000
    elif args.dataset == "digits" and args.num_classes < 10:
        parser.error(f"--num-classes {args.num_classes}: digits has 10 classes")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result = run(args)
    print(text_table(result))
    print(f"({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(markdown_table(result), encoding="utf-8")
    if args.chart:
        train_chart.plot_breakdown(result, str(args.chart))
    # Relative paths are the caller's working directory: say where each file went.
    for path in (args.json, args.markdown, args.chart, args.trace):
        if path:
            print(f"wrote {path.resolve()}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
