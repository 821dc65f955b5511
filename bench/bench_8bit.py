"""8-bit optimizer states: fusedopt's fused 8-bit step against the f32 steps and bitsandbytes' 8-bit CPU step, on
real parameter shapes, timed interleaved in one process (bench/torch_bench.py's rounds: rotating order, disturbed
rounds repeated). Each impl gets its own params and fixed grads (same seed); only optimizer.step() is timed.

  torch_fused      torch.optim.<X>(fused=True), f32 states (where torch has a fused CPU kernel)
  fused            fusedopt.Fused<X>(), f32 states
  fused_8bit       fusedopt.Fused<X>8bit(), bitsandbytes' format, block-wise 8-bit states
  bnb_8bit         bitsandbytes.optim.<X>8bit() on the CPU (its 0.50 CPU op); --no-bnb leaves it out (slow)
  deepspeed_cpu_adam  with --deepspeed (adam, adamw): DeepSpeed's CPU Adam, f32 states

The table gives each impl's median ms, its time relative to fused_8bit (the median and quartiles of the per-round
ratios) and the bytes of optimizer state it keeps per parameter, and how many disturbed rounds were thrown away.

  scripts/bench-8bit --shapes gpt2_small --threads 2
  scripts/bench-8bit --numel 100000000 --threads 1 --json out.json
  scripts/bench-8bit --shapes gpt2_small --threads 2 --no-bnb --betas 0.9 0.95 --warmup 330   # late steps
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import fusedopt
from load_monitor import LoadMonitor  # bench/ is this file's folder
from torch_bench import MODELS, make_params, spread, summary, tensor_shapes, time_steps

import torch

LR = 1e-3
TWINS = {"adamw": "AdamW8bit", "adam": "Adam8bit", "lion": "Lion8bit", "sgd": "SGD8bit",
         "rmsprop": "RMSprop8bit", "adagrad": "Adagrad8bit"}
ARGS = {"sgd": {"momentum": 0.9}}  # SGD8bit needs momentum (a buffer to keep)
TORCH = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad"}
TORCH_FUSED = {"adamw", "adam", "sgd", "adagrad"}  # torch 2.13's fused CPU kernels


def impls(optimizer: str, with_bnb: bool, deepspeed: bool, betas: tuple[float, float] | None = None) -> dict:
    """name -> constructor(params)."""
    kwargs = {"lr": LR, **ARGS.get(optimizer, {}), **({"betas": betas} if betas else {})}
    out = {}
    if optimizer in TORCH_FUSED:
        out["torch_fused"] = lambda ps: getattr(torch.optim, TORCH[optimizer])(ps, fused=True, **kwargs)
    fused_name = "FusedLion" if optimizer == "lion" else f"Fused{TORCH[optimizer]}"
    out["fused"] = lambda ps: getattr(fusedopt, fused_name)(ps, **kwargs)
    out["fused_8bit"] = lambda ps: getattr(fusedopt, f"Fused{TWINS[optimizer]}")(ps, **kwargs)
    if with_bnb:
        import bitsandbytes
        out["bnb_8bit"] = lambda ps: getattr(bitsandbytes.optim, TWINS[optimizer])(ps, **kwargs)
    if deepspeed and optimizer in ("adam", "adamw"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        out["deepspeed_cpu_adam"] = lambda ps: DeepSpeedCPUAdam(
            ps, lr=LR, weight_decay=1e-2 if optimizer == "adamw" else 0.0, adamw_mode=optimizer == "adamw",
            **({"betas": betas} if betas else {}))
    return out


def state_bytes_per_param(opt: torch.optim.Optimizer, numel: int) -> float:
    """Bytes of every tensor in the optimizer's state (the 8-bit classes' qmaps are shared, counted once)."""
    seen, total = set(), 0
    for state in opt.state.values():
        for value in state.values():
            tensors = value.values() if isinstance(value, dict) else [value]
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total / numel


def run(args: argparse.Namespace) -> dict:
    dims = tensor_shapes(args.shapes, args.numel)
    numel = sum(torch.Size(d).numel() for d in dims)
    makers = impls(args.optimizer, not args.no_bnb, args.deepspeed, tuple(args.betas) if args.betas else None)
    print(f"{args.optimizer} on {args.shapes or 'flat'}: {len(dims)} tensors, {numel:,} params, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds", file=sys.stderr)
    optimizers = {name: make(make_params(dims, torch.float32)) for name, make in makers.items()}
    samples, load = time_steps(optimizers, args.warmup, args.rounds, numel > 50_000_000, LoadMonitor(),
                               args.rounds)
    results = {name: summary(samples[name]) | {"state_bytes_per_param": state_bytes_per_param(opt, numel)}
               for name, opt in optimizers.items()}
    base = results["fused_8bit"]["samples_ms"]
    for r in results.values():  # each round's ratio: both impls stepped in that round, under its load
        r["vs_fused_8bit"] = spread([x / b for x, b in zip(r["samples_ms"], base)])
    return {"optimizer": args.optimizer, "shapes": args.shapes or "flat", "tensors": len(dims), "numel": numel,
            "threads": torch.get_num_threads(), "rounds": args.rounds, "warmup": args.warmup, "betas": args.betas,
            "target": fusedopt.active_target(),
            "impls": results, "load": load}


def text_table(result: dict) -> str:
    lines = [f"{result['optimizer']} on {result['shapes']} ({result['numel']:,} params, {result['threads']} threads, "
             f"target {result['target']})",
             f"{'impl':<20} {'median ms':>10} {'x fused_8bit (q1-q3)':>22} {'state B/param':>14}"]
    for name, r in result["impls"].items():
        ratio = r["vs_fused_8bit"]
        lines.append(f"{name:<20} {r['median_ms']:>10.2f} {ratio['median']:>9.2f} ({ratio['q1']:.2f}-{ratio['q3']:.2f})"
                     f" {r['state_bytes_per_param']:>14.3f}")
    lines.append(f"rounds thrown away (disturbed): {result['load']['discarded']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", choices=sorted(TWINS), default="adamw")
    parser.add_argument("--shapes", choices=MODELS, help="a model's per-tensor parameter shapes")
    parser.add_argument("--numel", type=int, help="one flat tensor of NUMEL elements instead")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (fusedopt follows it)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--betas", type=float, nargs=2, metavar=("BETA1", "BETA2"),
                        help="Adam's betas (adam, adamw; default torch's 0.9 0.999). GPT-style 0.9 0.95 with "
                             "--warmup 330 times late steps, whose bias corrections are exactly 1 "
                             "(docs/benchmarks.md, 'Late steps')")
    parser.add_argument("--no-bnb", action="store_true", help="leave bitsandbytes' CPU step out (it is slow)")
    parser.add_argument("--deepspeed", action="store_true", help="add DeepSpeed's CPU Adam (adam, adamw)")
    parser.add_argument("--json", type=pathlib.Path, help="write the result here")
    args = parser.parse_args()
    if (args.shapes is None) == (args.numel is None):
        parser.error("give one of --shapes and --numel")
    if args.betas and args.optimizer not in ("adam", "adamw"):
        parser.error(f"--betas is Adam's (adam, adamw), not {args.optimizer}'s")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    print(text_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
