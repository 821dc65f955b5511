"""Data-parallel training step under torchrun: DDP + torch.optim / fusedopt vs fusedopt.distributed.

`scripts/bench-train ... --nproc N` runs this file. Without torchrun around it, it starts
`torchrun --nproc-per-node N` on itself (gloo, rendezvous on 127.0.0.1, GLOO_SOCKET_IFNAME=lo,
OMP_NUM_THREADS=--threads per rank, 1 by default, since the ranks share the machine's cores). The
models, data and AdamW settings are the single-process bench's (bench/train_bench.py). Every rank
builds the same seeded model and batches and trains on its own 1/N slice of every batch; every
implementation trains its own deep copy of that one initialisation:

  ddp_torch        DDP + torch.optim.AdamW(foreach=False), the for-loop
  ddp_torch_fused  DDP + torch.optim.AdamW(fused=True)
  ddp_fused        DDP + fusedopt.FusedAdamW
  zero0            fusedopt.distributed.DistributedOptimizer(fusedopt.FusedAdamW(...), zero=0), no DDP
  zero1            the same with zero=1 (optimizer state sharded across the ranks)
  fsdp2_torch      FSDP2 (fully_shard on every block of a ModuleList, then the root) + torch.optim.AdamW
                   (foreach=False: the for-loop, torch's default for DTensor params)
  fsdp2_torch_fused  the same with torch.optim.AdamW(fused=True)
  fsdp2_fused      the same with fusedopt.FusedAdamW (the step over the rank's local shards)

The FSDP2 rows are asked for by name (--impls); --fsdp2-bf16 gives them MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=f32): bf16 compute, the optimizer stepping the f32 shards. --optimizer adafactor (adamp) puts
Adafactor (AdamP) in place of AdamW in the rows that can run it: ddp_torch (not AdamP: torch has none), ddp_fused,
fsdp2_fused.

DDP runs with forward_sync_buffers=False (no buffer broadcast before every forward; the
DistributedOptimizer syncs no buffers either) and bucket_cap_mb = --bucket-mb, the
DistributedOptimizer's bucket_mb. The default model is transformer_small (the single-process bench's
is mobilenet_v1). The impls alternate round by round in one job (every impl's step i, the order
rotating each round), each step started right after a barrier, so machine noise hits all of them
alike; a timed round during which other processes took more than 5 % of the machine (rank 0's reading of
/proc/stat less every rank's own CPU time: bench/load_monitor.py) is kept out of the timings and one more
round runs, at most --steps more (its steps happened: every impl still sees the same batches in the same
order); the report says how many. Per impl, over the steps after --warmup:

  step ms      median over steps of the slowest rank's step (forward + backward + optimizer + zero_grad)
  samples/s    global batch (all ranks' samples) / that median step
  phases       medians over steps of the ranks' mean: forward, backward (with the communication that
               DDP or the gradient hooks overlap with it and wait for), optimizer (step(), with
               ZeRO-1's parameter all-gather), zero_grad; medians need not add up to the step
  sent/rank    tx_bytes of the `lo` interface (/proc/net/dev) read by rank 0 around every timed step,
               minus the closing barrier's bytes (the median of 20 barriers, measured up front),
               summed, / (nproc * steps): bytes sent per rank per step, TCP/IP headers included. Other
               traffic on lo meanwhile counts too, so the median step's bytes / nproc come next to it
               (with a note when the two differ by over 1 %). The reference is the ring all-reduce
               volume 2 (P-1)/P * grad bytes.
  state/rank   bytes of optimizer state a rank holds: state_bytes() where the optimizer has it,
               otherwise the sum of nbytes of the tensors in optimizer.state; the max over ranks

  scripts/bench-train --model transformer_small --nproc 2 --json r.json
  scripts/bench-train --model transformer_small --nproc 2 --impls ddp_fused,zero0,zero1 --steps 30
  scripts/bench-train --model transformer_small --d-model 512 --n-layer 6 --vocab 2048 --nproc 2 \
      --impls fsdp2_torch,fsdp2_torch_fused,fsdp2_fused [--fsdp2-bf16]
  scripts/bench-train --model transformer_small --d-model 512 --n-layer 6 --vocab 2048 --nproc 2 \
      --optimizer adafactor --impls ddp_torch,ddp_fused,fsdp2_fused
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import uuid

import fusedopt
from fusedopt.progress import ProgressBar

import torch
from torch import distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_bench  # noqa: E402
import train_models  # noqa: E402
from load_monitor import LoadMonitor, Rounds, own_ticks  # noqa: E402

IMPLS = {
    "ddp_torch": "DDP + torch.optim.AdamW (for-loop)",
    "ddp_torch_fused": "DDP + torch.optim.AdamW (fused=True)",
    "ddp_fused": "DDP + fusedopt.FusedAdamW",
    "zero0": "fusedopt.distributed zero=0",
    "zero1": "fusedopt.distributed zero=1",
    "fsdp2_torch": "FSDP2 + torch.optim.AdamW (for-loop)",
    "fsdp2_torch_fused": "FSDP2 + torch.optim.AdamW (fused=True)",
    "fsdp2_fused": "FSDP2 + fusedopt.FusedAdamW",
}
DEFAULT_IMPLS = ["ddp_torch", "ddp_torch_fused", "ddp_fused", "zero0", "zero1"]
# --optimizer: (the class name in torch.optim and fusedopt's Fused<name>, its settings, the rows that can run it):
# torch 2.13's Adafactor has no fused=True and raises on FSDP2's Shard(0) DTensors, torch has no AdamP, and ZeRO-1
# shards neither.
ALGORITHMS = {"adamw": ("AdamW", train_bench.OPTIMIZERS["adamw"][1], tuple(IMPLS)),
              "adafactor": ("Adafactor", {"lr": 1e-2}, ("ddp_torch", "ddp_fused", "fsdp2_fused")),
              "adamp": ("AdamP", {"lr": 1e-3, "weight_decay": 1e-2}, ("ddp_fused", "fsdp2_fused"))}


def label(impl: str, optimizer: str) -> str:
    return IMPLS[impl].replace("AdamW", ALGORITHMS[optimizer][0])
TORCH_VARIANTS = {"ddp_torch": {"foreach": False}, "ddp_torch_fused": {"fused": True},
                  "fsdp2_torch": {"foreach": False}, "fsdp2_torch_fused": {"fused": True}}
ZERO = {"zero0": 0, "zero1": 1}
PHASES = ("forward", "backward", "optimizer", "zero_grad")
BARRIER_PROBES = 20
STARTED = time.perf_counter()


# ------------------------------------------------------------------------------- launcher


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--nproc="):
            skip = False
        elif arg == "--nproc":
            skip = True
        else:
            out.append(arg)
    return out


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Runs this script under torchrun with `argv` and returns torchrun's exit status."""
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    head = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd = head + [
        "--nnodes=1",
        f"--nproc-per-node={args.nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        f"--rdzv-id={uuid.uuid4()}",
        "--local-addr=127.0.0.1",
        "--max-restarts=0",
        str(pathlib.Path(__file__).resolve()),
        *without_nproc(argv),  # torchrun would read --nproc as an abbreviation of its --nproc-per-node
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), GLOO_SOCKET_IFNAME="lo")
    started = time.perf_counter()
    code = subprocess.call(cmd, env=env)
    print(f"({time.perf_counter() - started:.1f} s, torchrun start-up included)", file=sys.stderr)
    return code


# ------------------------------------------------------------------------------ measuring


def lo_tx_bytes() -> int | None:
    """The `lo` interface's transmitted bytes from /proc/net/dev (None where there is none)."""
    try:
        with open("/proc/net/dev", encoding="ascii") as f:
            for line in f:
                name, sep, counters = line.partition(":")
                if sep and name.strip() == "lo":
                    return int(counters.split()[8])  # 8 receive counters, then transmit bytes
    except OSError:
        pass
    return None


def state_bytes(opt) -> tuple[int, str]:
    """(bytes of optimizer state this rank holds, how they were counted)."""
    if hasattr(opt, "state_bytes"):
        return int(opt.state_bytes()), "state_bytes()"
    tensors = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    # (a DTensor's nbytes is its whole tensor's: this rank holds its local shard)
    return sum(getattr(t, "_local_tensor", t).nbytes for t in tensors), "optimizer.state tensors"


def distributed_module(impls: list[str]):
    """fusedopt.distributed, or None (with a note) when it cannot be imported and a zero row is asked for."""
    if not any(impl in ZERO for impl in impls):
        return None
    try:
        import fusedopt.distributed as fd
    except ImportError as e:
        if dist.get_rank() == 0:
            skipped = ", ".join(i for i in impls if i in ZERO)
            print(f"note: fusedopt.distributed cannot be imported ({e}); skipping {skipped}", file=sys.stderr)
        return None
    return fd


def build(impl: str, base: torch.nn.Module, args: argparse.Namespace, fd) -> tuple:
    """(module to call, optimizer, its parameters) for one impl, on its own copy of `base`."""
    model = copy.deepcopy(base)
    name, kwargs, _ = ALGORITHMS[args.optimizer]
    fused, reference = getattr(fusedopt, "Fused" + name), getattr(torch.optim, name, None)
    if impl in ZERO:
        inner = fused(model.parameters(), **kwargs)
        opt = fd.DistributedOptimizer(inner, zero=ZERO[impl], bucket_mb=args.bucket_mb, process_group=None)
        return model, opt, list(model.parameters())
    if impl.startswith("fsdp2_"):
        shard_fsdp2(model, args)
        if impl == "fsdp2_fused":
            opt = fused(model.parameters(), **kwargs)
        else:
            opt = reference(model.parameters(), **kwargs, **TORCH_VARIANTS[impl])
        return model, opt, list(model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False, bucket_cap_mb=args.bucket_mb)
    if impl == "ddp_fused":
        opt = fused(model.parameters(), **kwargs)
    else:
        opt = reference(model.parameters(), **kwargs, **TORCH_VARIANTS[impl])
    return ddp, opt, list(model.parameters())


def shard_fsdp2(model: torch.nn.Module, args: argparse.Namespace) -> None:
    """fully_shard as torch's recipes apply it: every block of the model's ModuleLists, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    kw = {"mesh": mesh}
    if args.fsdp2_bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blocks in [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]:
        for block in blocks:
            fully_shard(block, **kw)
    fully_shard(model, **kw)


def train_step(module, opt, loss_fn, batch, warmup: bool) -> dict:
    x, y = batch
    t0 = time.perf_counter()
    loss = loss_fn(module(x), y)
    loss_value = float(loss.detach())
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    t3 = time.perf_counter()
    opt.zero_grad()
    t4 = time.perf_counter()
    ms = [1e3 * (b - a) for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4))]
    return {"loss": loss_value, "warmup": warmup, "step_ms": 1e3 * (t4 - t0), "phases_ms": dict(zip(PHASES, ms))}


def barrier_bytes() -> float | None:
    """lo bytes (all ranks together) one barrier sends: the closing barrier of every timed step adds them.
    The median of BARRIER_PROBES barriers, so that other traffic on lo meanwhile does not inflate it."""
    dist.barrier()
    probes = []
    for _ in range(BARRIER_PROBES):
        before = lo_tx_bytes()
        dist.barrier()
        after = lo_tx_bytes()
        if before is None or after is None:
            return None
        probes.append(after - before)
    return statistics.median(probes)


def my_slice(batch: tuple, rank: int, nproc: int) -> tuple:
    x, y = batch
    n = len(x) // nproc
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def run(args: argparse.Namespace) -> dict | None:
    """Trains every impl on every rank (alternating round by round); returns the report on rank 0."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, nproc = dist.get_rank(), dist.get_world_size()
    if args.batch_size % nproc:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of --nproc {nproc}")
    fd = distributed_module(args.impls)
    impls = [i for i in args.impls if i not in ZERO or fd is not None]
    skipped = [i for i in args.impls if i not in impls]
    base = train_bench.make_model(args)
    pool = [my_slice(b, rank, nproc) for b in train_bench.make_pool(args)]
    loss_fn = train_models.lm_loss if args.model == "transformer_small" else torch.nn.functional.cross_entropy
    runners = {impl: build(impl, base, args, fd) for impl in impls}
    batches = {impl: train_models.cycle(pool) for impl in impls}
    params = list(base.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    total = args.warmup + args.steps
    if rank == 0:
        print(
            f"{args.model}: {len(params)} tensors, {sum(p.numel() for p in params):,} params; {args.optimizer}, global batch "
            f"{args.batch_size} ({args.batch_size // nproc} per rank), {nproc} ranks x {torch.get_num_threads()} "
            f"threads (gloo); {args.warmup} warm-up + {args.steps} timed rounds of {', '.join(impls)}",
            file=sys.stderr,
        )
    per_barrier = barrier_bytes()  # every rank takes part; rank 0's reading is the one used
    records = {impl: [] for impl in impls}
    sent = {impl: [] for impl in impls}  # rank 0: lo bytes of every timed step (all ranks' sends)
    bar = ProgressBar(total, "rounds", enabled=rank == 0)
    every = 0 if bar.enabled or rank != 0 else max(1, total // 10)
    # A timed round during which other processes took more than 5 % of the machine (rank 0's reading of
    # /proc/stat, less every rank's own CPU time) is kept out of the timings, and one more runs (at most --steps).
    monitor, load = LoadMonitor(), Rounds()
    step = 0
    while step < total:
        dist.barrier()
        start = own_ticks()
        monitor.begin()
        shift = step % len(impls)
        for impl in impls[shift:] + impls[:shift]:
            module, opt, _ = runners[impl]
            before = lo_tx_bytes() if rank == 0 else None
            records[impl].append(train_step(module, opt, loss_fn, next(batches[impl]), step < args.warmup))
            dist.barrier()  # the peers' sends for this step are done: the next read counts them all
            if rank == 0 and step >= args.warmup and before is not None:
                sent[impl].append(lo_tx_bytes() - before - (per_barrier or 0))
        peers = torch.tensor([0 if rank == 0 else own_ticks() - start], dtype=torch.int64)
        dist.all_reduce(peers)
        round_load = monitor.end(int(peers))
        drop = torch.tensor([rank == 0 and step >= args.warmup and round_load.disturbed
                             and load.discarded < args.steps], dtype=torch.int64)
        dist.broadcast(drop, 0)
        if drop:
            load.discarded += 1
            for impl in impls:
                records[impl].pop()
                if sent[impl] and len(sent[impl]) > step - args.warmup:
                    sent[impl].pop()
            continue
        if step >= args.warmup:
            load.results.append(step)
            load.loads.append(round_load)
        step += 1
        text = "  ".join(f"{impl} {records[impl][-1]['step_ms']:.0f}ms" for impl in impls)
        bar.update(step, text)
        if every and (step % every == 0 or step == total):
            print(f"  round {step}/{total} (rank 0): {text}", file=sys.stderr)
    bar.close(total)

    # Everything below happens after the timed loop: gather the ranks' numbers on rank 0.
    local = {
        impl: {
            "records": records[impl],
            "state": state_bytes(runners[impl][1]),
            # (a DTensor param's whole values: a collective, which every rank runs in the same order)
            "checksum": sum(float((p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().sum())
                            for p in runners[impl][2]),
        }
        for impl in impls
    }
    gathered = [None] * nproc if rank == 0 else None
    dist.gather_object(local, gathered, dst=0)
    # The DDP wrappers and optimizers hold the process group: they go first (the timed loop's last ones too),
    # or a rank can abort at exit ("terminate called without an active exception").
    module = opt = None
    runners.clear()
    gc.collect()
    dist.destroy_process_group()
    if rank != 0:
        return None
    lo = per_barrier is not None
    numel = sum(p.numel() for p in params)
    sent = {i: sent[i] if lo else None for i in impls}
    return {**report(args, impls, skipped, gathered, sent, numel, grad_bytes, per_barrier), "load": load.report(),
            "load_text": load.describe()}


# ------------------------------------------------------------------------------- summary


def summarize(args: argparse.Namespace, label: str, ranks: list[dict], sent: list[int] | None, nproc: int) -> dict:
    timed = [i for i, r in enumerate(ranks[0]["records"]) if not r["warmup"]]
    job_ms = [max(r["records"][i]["step_ms"] for r in ranks) for i in timed]  # the slowest rank's step
    phases = {
        p: statistics.median(statistics.fmean(r["records"][i]["phases_ms"][p] for r in ranks) for i in timed)
        for p in PHASES
    }
    step_ms = statistics.median(job_ms)
    optimizer_ms = [statistics.fmean(r["records"][i]["phases_ms"]["optimizer"] for r in ranks) for i in timed]
    per_rank_state = [r["state"][0] for r in ranks]
    checksums = [r["checksum"] for r in ranks]
    return {
        "label": label,
        "samples_per_s": args.batch_size / (step_ms / 1e3),
        "step_ms": step_ms,
        "phases_ms": phases,
        # the spread of the optimizer phase over the timed steps (the ranks' mean): its quartiles
        "optimizer_ms_quartiles": statistics.quantiles(optimizer_ms, n=4)[::2] if len(optimizer_ms) > 1 else None,
        "step_ms_all": job_ms,
        "bytes_sent_per_rank_per_step": None if sent is None else sum(sent) / (nproc * len(timed)),
        "bytes_sent_per_rank_median_step": None if sent is None else statistics.median(sent) / nproc,
        "lo_tx_bytes_steps": sent,  # every timed step's lo bytes, all ranks together
        "state_bytes_per_rank": per_rank_state,
        "state_bytes": max(per_rank_state),
        "state_bytes_source": ranks[0]["state"][1],
        "params_equal_across_ranks": max(checksums) == min(checksums),
        "losses_rank0": [r["loss"] for r in ranks[0]["records"]],
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def report(args, impls, skipped, gathered, sent, numel, grad_bytes, per_barrier) -> dict:
    nproc = len(gathered)
    rows = {impl: summarize(args, label(impl, args.optimizer), [g[impl] for g in gathered], sent[impl], nproc)
            for impl in impls}
    ring = 2 * (nproc - 1) / nproc * grad_bytes
    base = rows.get("ddp_fused")
    for r in rows.values():
        r["bytes_vs_ring"] = ratio(r["bytes_sent_per_rank_per_step"], ring)
        # Round by round, this impl's step over DDP + FusedAdamW's in the same round: slow phases of the
        # machine hit both, so the median of the ratios is steadier than the ratio of the medians.
        r["step_vs_ddp_fused_paired"] = None if base is None else statistics.median(
            a / b for a, b in zip(r["step_ms_all"], base["step_ms_all"]))
    get = lambda impl, key: rows[impl][key] if impl in rows else None  # noqa: E731
    ref = (rows.get("ddp_torch") or next(iter(rows.values())))["losses_rank0"][: train_bench.LOSS_CHECK_STEPS]
    loss_diff = max(abs(a - b) / max(abs(b), 1e-30) for r in rows.values() for a, b in zip(r["losses_rank0"], ref))
    forward = [r["phases_ms"]["forward"] for r in rows.values()]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "model": args.model,
        "optimizer": args.optimizer,
        "nproc": nproc,
        "backend": "gloo",
        "batch_size": args.batch_size,
        "batch_size_per_rank": args.batch_size // nproc,
        "threads_per_rank": torch.get_num_threads(),
        "steps": args.steps,
        "warmup": args.warmup,
        "bucket_mb": args.bucket_mb,
        "environment": {
            "cores": cores,
            "cpu_count": os.cpu_count(),
            "torch_version": torch.__version__,
            "target": fusedopt.active_target(),
            "python": sys.version.split()[0],
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "params": numel,
        "grad_bytes": grad_bytes,
        "ring_allreduce_bytes_per_rank": ring,
        "barrier_bytes": per_barrier,
        "skipped": skipped,
        "impls": rows,
        "zero0_vs_ddp_fused_samples_per_s": ratio(get("zero0", "samples_per_s"), get("ddp_fused", "samples_per_s")),
        "zero1_vs_zero0_state_bytes": ratio(get("zero1", "state_bytes"), get("zero0", "state_bytes")),
        "fsdp2_bf16": args.fsdp2_bf16,
        # the FSDP2 rows' optimizer step: torch's over fusedopt's (each the median over the timed steps)
        "fsdp2_optimizer_speedup": {
            impl: ratio(rows[impl]["phases_ms"]["optimizer"], rows["fsdp2_fused"]["phases_ms"]["optimizer"])
            for impl in ("fsdp2_torch", "fsdp2_torch_fused") if impl in rows and "fsdp2_fused" in rows},
        "max_loss_rel_diff_first10": loss_diff,
        "forward_ms_spread": (max(forward) - min(forward)) / min(forward),
        "run_s": time.perf_counter() - STARTED,
    }


# -------------------------------------------------------------------------------- reports

HEADER = [
    "impl",
    "samples/s",
    "step ms",
    "fwd ms",
    "bwd+comm ms",
    "opt ms",
    "sent MB/rank/step",
    "(median)",
    "vs ring",
    "state MB/rank",
    "vs ddp_torch",
    "step / ddp_fused's (paired)",
]


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def table_rows(result: dict) -> list[list[str]]:
    base = result["impls"].get("ddp_torch", {}).get("samples_per_s")
    rows = []
    for impl, r in result["impls"].items():
        rows.append(
            [
                f"{impl}: {r['label']}",
                f"{r['samples_per_s']:.1f}",
                f"{r['step_ms']:.1f}",
                f"{r['phases_ms']['forward']:.1f}",
                f"{r['phases_ms']['backward']:.1f}",
                f"{r['phases_ms']['optimizer']:.1f}",
                fmt(r["bytes_sent_per_rank_per_step"], ".2f", 1e-6),
                fmt(r["bytes_sent_per_rank_median_step"], ".2f", 1e-6),
                fmt(r["bytes_vs_ring"], ".2f"),
                f"{r['state_bytes'] / 1e6:.2f}",
                fmt(ratio(r["samples_per_s"], base), ".2f") + ("x" if base else ""),
                fmt(r["step_vs_ddp_fused_paired"], ".3f"),
            ]
        )
    return rows


def title(result: dict) -> str:
    env = result["environment"]
    return (
        f"{result['model']} / {result['optimizer']}, {result['nproc']} ranks (gloo) x {result['threads_per_rank']} threads on "
        f"{env['cores']} cores, global batch {result['batch_size']}, {result['steps']} timed rounds "
        f"(+{result['warmup']} warm-up), torch {env['torch_version']}, {env['target']}"
        + (", FSDP2 rows in bf16 compute" if result.get("fsdp2_bf16") else "")
    )


def notes(result: dict) -> list[str]:
    out = [
        f"ring all-reduce reference 2(P-1)/P * grad bytes: {result['ring_allreduce_bytes_per_rank'] / 1e6:.2f} MB/rank/"
        f"step ({result['grad_bytes'] / 1e6:.2f} MB of f32 grads)",
        f"max loss rel diff over the first {train_bench.LOSS_CHECK_STEPS} steps (rank 0): "
        f"{result['max_loss_rel_diff_first10']:.2e}; forward times differ by "
        f"{100 * result['forward_ms_spread']:.1f} % across impls (the noise floor)",
    ]
    if result["zero0_vs_ddp_fused_samples_per_s"] is not None:
        out.append(f"zero=0 vs DDP+FusedAdamW samples/s: {fmt(result['zero0_vs_ddp_fused_samples_per_s'], '.3f')}x")
    if result["zero1_vs_zero0_state_bytes"] is not None:
        out.append(f"zero=1 state bytes / zero=0 state bytes: {fmt(result['zero1_vs_zero0_state_bytes'], '.3f')}")
    noisy = [
        i
        for i, r in result["impls"].items()
        if r["bytes_sent_per_rank_per_step"] is not None
        and abs(r["bytes_sent_per_rank_per_step"] - r["bytes_sent_per_rank_median_step"])
        > 0.01 * r["bytes_sent_per_rank_median_step"]
    ]
    if noisy:
        out.append(
            f"note: sent bytes of {', '.join(noisy)}: mean and median step differ by over 1 %; other traffic on lo "
            "during the run (see lo_tx_bytes_steps in the JSON)"
        )
    for impl, speedup in result.get("fsdp2_optimizer_speedup", {}).items():
        out.append(f"optimizer step, {IMPLS[impl]} / {IMPLS['fsdp2_fused']}: {fmt(speedup, '.2f')}x")
    if "load_text" in result:
        out.append(f"rounds: {result['load_text']} (rank 0's reading; a round where other processes took over 5 % "
                   "of the machine is repeated)")
    if result["barrier_bytes"] is None:
        out.append("note: no `lo` interface in /proc/net/dev: bytes sent not measured")
    unsynced = [i for i, r in result["impls"].items() if not r["params_equal_across_ranks"]]
    if unsynced:
        out.append(f"WARNING: parameters differ across ranks after the run: {', '.join(unsynced)}")
    if result["skipped"]:
        out.append(f"skipped (fusedopt.distributed cannot be imported): {', '.join(result['skipped'])}")
    return out


def text_table(result: dict) -> str:
    rows = [HEADER] + table_rows(result)
    widths = [max(len(row[c]) for row in rows) for c in range(len(HEADER))]
    lines = [title(result)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines + notes(result))


def markdown_table(result: dict) -> str:
    lines = [f"**{title(result)}**", "", "| " + " | ".join(HEADER) + " |", "|---|" + "--:|" * (len(HEADER) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    return "\n".join(lines + [""] + [n + "  " for n in notes(result)] + [""])


# ----------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, help="ranks (torchrun --nproc-per-node; under torchrun: WORLD_SIZE)")
    parser.add_argument("--model", choices=train_models.MODELS, default="transformer_small")
    parser.add_argument("--impls", type=functools.partial(train_bench.impl_list, impls=IMPLS),
                        default=list(DEFAULT_IMPLS), help=f"comma-separated (default: {','.join(DEFAULT_IMPLS)})")
    parser.add_argument("--optimizer", choices=ALGORITHMS, default="adamw",
                        help="every row's algorithm (adafactor: the rows ddp_torch, ddp_fused and fsdp2_fused; adamp: "
                             "ddp_fused and fsdp2_fused)")
    parser.add_argument("--fsdp2-bf16", action="store_true",
                        help="the FSDP2 rows compute in bf16 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32))")
    parser.add_argument("--batch-size", type=int, default=32, help="global, split across the ranks (default 32)")
    parser.add_argument("--image-size", type=int, default=32, help="image models (default 32)")
    parser.add_argument("--num-classes", "--classes", type=int, help="image models (default 1000; digits: 10)")
    parser.add_argument(
        "--dataset", "--data", choices=("synthetic", "digits"), default="synthetic", help="image models"
    )
    parser.add_argument("--vocab", type=int, default=1024, help="transformer_small")
    parser.add_argument("--seq-len", type=int, default=64, help="transformer_small")
    parser.add_argument("--d-model", type=int, default=128, help="transformer_small")
    parser.add_argument("--n-layer", type=int, default=8, help="transformer_small")
    parser.add_argument("--n-head", type=int, default=4, help="transformer_small")
    parser.add_argument("--pool", type=int, default=8, help="distinct batches, cycled (default 8)")
    parser.add_argument("--steps", type=int, default=16, help="timed rounds (default 16)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb and bucket_mb (default 25)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per rank (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds (default 300)")
    parser.add_argument("--json", type=pathlib.Path, help="write the report here (rank 0)")
    parser.add_argument("--markdown", type=pathlib.Path, help="write the table here as Markdown")
    args = parser.parse_args(argv)
    runs = ALGORITHMS[args.optimizer][2]
    if set(args.impls) - set(runs):
        parser.error(f"--optimizer {args.optimizer} runs the rows {', '.join(runs)} only (torch has no AdamP, its "
                     "Adafactor no fused=True and raises on FSDP2's DTensors; ZeRO-1 shards neither), not "
                     + ", ".join(sorted(set(args.impls) - set(runs))))
    if under_torchrun():
        args.nproc = int(os.environ["WORLD_SIZE"])
    elif args.nproc is None:
        parser.error("--nproc is required (or run this file under torchrun)")
    for name, low in (
        ("nproc", 1),
        ("batch_size", 1),
        ("image_size", 8),
        ("num_classes", 2),
        ("vocab", 2),
        ("seq_len", 1),
        ("d_model", 1),
        ("n_layer", 1),
        ("n_head", 1),
        ("pool", 1),
        ("steps", 1),
        ("warmup", 0),
        ("threads", 1),
    ):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if args.batch_size % args.nproc:
        parser.error(f"--batch-size {args.batch_size} must be a multiple of --nproc {args.nproc}")
    if not args.bucket_mb > 0 or not args.timeout > 0:
        parser.error("--bucket-mb and --timeout must be positive")
    if args.num_classes is None:
        args.num_classes = 10 if args.dataset == "digits" else 1000
    elif args.dataset == "digits" and args.num_classes < 10:
        parser.error(f"--num-classes {args.num_classes}: digits has 10 classes")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not under_torchrun():
        return launch(args, argv)
    result = run(args)
    if result is None:  # not rank 0
        return 0
    print(text_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(markdown_table(result), encoding="utf-8")
    for path in (args.json, args.markdown):
        if path:
            print(f"wrote {path.resolve()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
