"""Runs a test's function in N processes joined into one gloo process group on 127.0.0.1.

    results = run_ranks("test_distributed:two_rank_case", 2, args=(...,))   # one result per rank

Each rank is a fresh `python dist_harness.py` process (no fork of the pytest worker, whose threads and
state would come along): it joins the group through a file store in a temporary directory (no port to
pick, so no race with other tests), imports the module, calls fn(*args) and torch.saves what it returns.
Every wait is bounded: past `timeout` seconds the ranks still running are killed and the call fails, so a
rank that hangs in a collective never hangs the test suite."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(target: str, world_size: int, *, args: tuple = (), timeout: float = 120.0,
              threads: int | None = 1) -> list:
    """fn(*args) in every rank of a world_size-process gloo group, `target` as "module:function" (a
    module in tests/python); returns the ranks' return values in rank order. A rank that fails, or a run
    past `timeout` seconds, raises AssertionError with the ranks' output. threads: the ranks'
    OMP_NUM_THREADS (None: unset)."""
    with tempfile.TemporaryDirectory(prefix="fusedopt-dist-") as tmp:
        torch.save(args, os.path.join(tmp, "args.pt"))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "GLOO_SOCKET_IFNAME": "lo",
               "PYTHONPATH": os.pathsep.join([_HERE, os.environ.get("PYTHONPATH", "")])}
        if threads is None:
            for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
                env.pop(name, None)
        procs = []
        for rank in range(world_size):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+b")
            cmd = [sys.executable, os.path.abspath(__file__), target, str(rank), str(world_size), tmp]
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            for proc, _ in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        finally:
            for proc, _ in procs:  # a rank left waiting on a dead peer
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        logs = []
        for rank, (proc, log) in enumerate(procs):
            log.seek(0)
            logs.append(f"--- rank {rank} (exit {proc.returncode}) ---\n" + log.read().decode(errors="replace"))
            log.close()
        if timed_out or any(proc.returncode != 0 for proc, _ in procs):
            why = f"timed out after {timeout:g} s" if timed_out else "a rank failed"
            raise AssertionError(f"{target} on {world_size} ranks: {why}\n" + "\n".join(logs))
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def _rank_main(target: str, rank: int, world_size: int, tmp: str) -> None:
    import gc
    import importlib
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        module, name = target.split(":")
        fn = getattr(importlib.import_module(module), name)
        result = fn(*torch.load(os.path.join(tmp, "args.pt"), weights_only=False))
        torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        # What holds the process group (a DDP wrapper in a reference cycle) goes first, or the rank can abort
        # at exit ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
