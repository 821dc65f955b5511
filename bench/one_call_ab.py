"""The drop-in's unchanged step in one call into C++ (_step_unchanged) against its ordinary path and the engine alone,
on the same optimizer and tensors: its one call is switched on and off from round to round, and the engine runs the
step it packed (bench-torch's EngineOnly), so where the tensors lie does not weigh in (two impls of tensors of their own
differ by a few percent). Each step runs right after a neighbour's (torch's fused step, or another fused step),
which evicts what the check reads, as in bench-torch's rounds. Prints the medians of the per-round differences.

    .venv/bin/python bench/one_call_ab.py --optimizer adamw --after torch_fused --rounds 1500
(docs/benchmarks.md, "One call into C++")"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from torch_bench import EngineOnly, build_fused, make_params, references, tensor_shapes

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--shapes", default="mobilenet_v1")
    parser.add_argument("--numel", type=int, help="one tensor of NUMEL params instead of --shapes")
    parser.add_argument("--after", choices=["torch_fused", "fused"], default="torch_fused")
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dims = tensor_shapes(args.shapes, args.numel)
    params = lambda: make_params(dims, torch.float32)  # noqa: E731
    if args.after == "fused":
        neighbour = build_fused(args.optimizer, params(), False)
    else:
        refs = references(args.optimizer, torch.float32)
        if args.after not in refs:
            parser.error(f"--after {args.after}: torch has no fused step for {args.optimizer}; use --after fused")
        neighbour = refs[args.after](params())
    opt = build_fused(args.optimizer, params(), False)
    for o in (opt, neighbour):
        o.step()
        o.step()
    engine = EngineOnly(opt).step

    def ordinary_path(*_):
        return False

    def one_call() -> None:
        opt.__dict__.pop("_step_unchanged", None)
        opt.step()

    def ordinary() -> None:
        opt._step_unchanged = ordinary_path
        opt.step()

    impls = {"one call": one_call, "ordinary path": ordinary, "engine": engine}
    ns: dict[str, list[int]] = {name: [] for name in impls}
    order = list(impls)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            neighbour.step()
            start = time.perf_counter_ns()
            impls[name]()
            ns[name].append(time.perf_counter_ns() - start)

    def over(a: str, b: str) -> float:  # µs, the median of the per-round differences
        return statistics.median(x - y for x, y in zip(ns[a], ns[b])) / 1e3

    ratio = statistics.median(x / y for x, y in zip(ns["one call"], ns["engine"])) - 1.0
    print(f"{args.optimizer} on {args.shapes if args.numel is None else args.numel} after {args.after}, {args.rounds} rounds: engine "
          f"{statistics.median(ns['engine']) / 1e3:.1f} µs; the one call saves {over('ordinary path', 'one call'):.1f} "
          f"µs, and takes {over('one call', 'engine'):+.1f} µs ({ratio:+.1%}) over the engine")


if __name__ == "__main__":
    sys.exit(main())
