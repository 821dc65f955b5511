"""step_in_backward=True against the ordinary fused step on a transformer: training-step time, timed interleaved
in one process (two copies of one model, one step of each per round, the order alternating, disturbed rounds
thrown away and repeated), and each mode's peak memory,
measured in a process of its own (peak RSS; glibc's mmap threshold fixed so that freed tensors leave the RSS). The
default batch is small (1 x 64 tokens): with large batches the activations, not the gradients, set the peak.

  scripts/bench-in-backward --d-model 768 --n-layer 8 --threads 2      # 57 M params
  scripts/bench-in-backward --accumulation-steps 4                     # a step per micro-batch, 1 in 4 updates
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import fusedopt

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_models  # noqa: E402  (bench/ is this file's folder)
from load_monitor import LoadMonitor, timed_rounds  # noqa: E402
from torch_bench import spread  # noqa: E402

MODES = {"ordinary": False, "in_backward": True}


def make(args, in_backward: bool):
    torch.manual_seed(0)
    model = train_models.transformer_small(args.vocab, args.seq_len, args.d_model, args.n_layer, args.n_head)
    return model, fusedopt.FusedAdamW(model.parameters(), lr=1e-4, step_in_backward=in_backward,
                                      accumulation_steps=args.accumulation_steps)


def train_step(model, opt, batch) -> float:
    start = time.perf_counter()
    opt.zero_grad()
    train_models.lm_loss(model(batch[0]), batch[1]).backward()
    opt.step()
    return (time.perf_counter() - start) * 1e3


def timed(args) -> dict:
    """Both modes in this process, one training step each per round, the order alternating; a round during
    which other processes took more than 5 % of the machine is thrown away and repeated (load_monitor.py).
    Median ms per step, and the quartiles of the per-round ratio in_backward / ordinary."""
    runs = {mode: make(args, flag) for mode, flag in MODES.items()}
    batches = train_models.token_batches(4, args.batch_size, args.seq_len, args.vocab, seed=1)
    for step in range(args.warmup):
        for mode in MODES:
            train_step(*runs[mode], batches[step % len(batches)])

    def one_round(r: int) -> dict[str, float]:
        batch = batches[r % len(batches)]
        order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
        return {mode: train_step(*runs[mode], batch) for mode in order}

    kept = timed_rounds(one_round, args.steps, LoadMonitor(), args.steps)
    ms = {mode: [r[mode] for r in kept.results] for mode in MODES}
    same = all(torch.equal(a, b) for a, b in zip(runs["ordinary"][0].parameters(),
                                                   runs["in_backward"][0].parameters()))
    params = sum(p.numel() for p in runs["ordinary"][0].parameters())
    return {"params": params, "median_ms": {m: statistics.median(v) for m, v in ms.items()},
            "ratio": spread([b / a for a, b in zip(ms["ordinary"], ms["in_backward"])]),
            "load": kept.report(), "bit_identical": same}


def peak_rss_kib() -> int:
    """This process's peak RSS: VmHWM, its own address space's (getrusage's ru_maxrss also counts the parent's
    RSS at a vfork, which Python's subprocess uses)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def peak(args, mode: str) -> int:
    """Max RSS (KiB) of a process that makes one mode's model and takes warmup + steps training steps."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    cmd = [sys.executable, __file__, "--peak-of", mode] + [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                                                           if k not in ("peak_of", "json") and v is not None]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=1800)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("vocab", 8192), ("seq-len", 64), ("d-model", 768), ("n-layer", 8), ("n-head", 12),
                          ("batch-size", 1), ("steps", 10), ("warmup", 2), ("accumulation-steps", 1), ("threads", None)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--peak-of", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.peak_of:
        model, opt = make(args, MODES[args.peak_of])
        batches = train_models.token_batches(2, args.batch_size, args.seq_len, args.vocab, seed=1)
        for step in range(args.warmup + args.steps):
            train_step(model, opt, batches[step % 2])
        print(peak_rss_kib())
        return
    result = timed(args) | {"peak_mib": {m: peak(args, m) / 1024 for m in MODES}}
    result["grad_mib"] = result["params"] * 4 / 2**20
    print(f"transformer_small d_model {args.d_model} x {args.n_layer} layers: {result['params']:,} params, "
          f"{torch.get_num_threads()} threads, accumulation_steps {args.accumulation_steps}; the two runs' params "
          f"{'equal' if result['bit_identical'] else 'DIFFER'}")
    print(f"{'mode':<12} {'step ms':>9} {'peak MiB':>9}")
    for m in MODES:
        print(f"{m:<12} {result['median_ms'][m]:>9.1f} {result['peak_mib'][m]:>9.0f}")
    ratio = result["ratio"]
    print(f"in_backward / ordinary step time, per round: {ratio['median']:.3f} (quartiles {ratio['q1']:.3f}-"
          f"{ratio['q3']:.3f}); rounds thrown away (disturbed): {result['load']['discarded']}")
    print(f"peak lower by {result['peak_mib']['ordinary'] - result['peak_mib']['in_backward']:.0f} MiB "
          f"(gradients: {result['grad_mib']:.0f} MiB)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
