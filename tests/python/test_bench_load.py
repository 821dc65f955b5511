"""bench/load_monitor.py against real disturbances: a busy-loop process running during a round gets the
round flagged, and the monitor's count of other processes' CPU time agrees with an independent one (the
sum of every other process's own times in /proc/<pid>/stat). Flags are asserted, never timings."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import load_monitor  # noqa: E402

pytestmark = pytest.mark.skipif(not pathlib.Path("/proc/stat").exists(), reason="reads /proc (Linux)")

ROUND_S = 0.25  # each round busy-loops this long in this process, as a benchmark's step would


class BusyLoop:
    """A process that spins on one CPU from __enter__ (once it has started) to __exit__."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def cpu_ticks(self) -> int:
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(timeout=30)


def others_ticks_by_process() -> int:
    """The independent count: utime + stime + the reaped children's cutime + cstime of every process
    but this one, so that processes that ended in between still count through their parent."""
    total = 0
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we read
            continue
        total += sum(int(f) for f in fields[11:15])
    return total


def unattributed_ticks() -> int:
    """irq, softirq and steal ticks of all CPUs (/proc/stat): the monitor counts them as others' time,
    no process holds them (steal is the VM's host running someone else)."""
    fields = pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[6]) + int(fields[7]) + int(fields[8])


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def monitored_round(monitor: load_monitor.LoadMonitor, disturb: bool):
    """One round of ROUND_S of this process's own work, with or without a busy loop beside it:
    (the monitor's RoundLoad, the others' share by process (plus irq and steal time), the busy loop's
    CPU ticks in the round)."""
    loop = BusyLoop() if disturb else None
    if loop:
        loop.__enter__()
    try:
        loop_start = loop.cpu_ticks() if loop else 0
        by_process = others_ticks_by_process() + unattributed_ticks()
        monitor.begin()
        busy(ROUND_S)
        load = monitor.end()
        by_process = others_ticks_by_process() + unattributed_ticks() - by_process
        loop_ticks = loop.cpu_ticks() - loop_start if loop else 0
    finally:
        if loop:
            loop.__exit__(None, None, None)
    return load, by_process * load_monitor.TICK_S / (load.wall_s * monitor.cpus), loop_ticks


def test_rounds_with_a_busy_process_are_flagged_and_quiet_ones_are_not():
    monitor = load_monitor.LoadMonitor()
    for disturb in (False, True, False, True, False, True):
        load, share_by_process, loop_ticks = monitored_round(monitor, disturb)
        what = f"disturbed={disturb}: {load}, others' share by process {share_by_process:.3f}"
        if disturb:
            assert load.disturbed, what
            # The busy loop is one of the others: its CPU time is inside the monitor's count.
            assert load.others_cpu_s >= (loop_ticks - load_monitor.NOISE_TICKS) * load_monitor.TICK_S, what
        elif share_by_process < monitor.share / 4:
            # Quiet by the independent count too: this process's own busy loop is not another's load.
            assert not load.disturbed, what
        elif share_by_process > 2 * monitor.share:
            assert load.disturbed, what  # the machine is shared right now (other tests, a build)


def test_timed_rounds_repeats_disturbed_rounds_up_to_the_cap_and_counts_them():
    monitor = load_monitor.LoadMonitor()
    calls = []

    def disturbed_round(k):
        calls.append(k)
        with BusyLoop():
            busy(ROUND_S)
        return k

    out = load_monitor.timed_rounds(disturbed_round, rounds=2, monitor=monitor, max_discards=1)
    # The first attempt at round 0 is thrown away, the second kept (the cap is reached), then round 1.
    assert calls == [0, 0, 1]
    assert out.results == [0, 1]
    assert out.discarded == 1 and out.disturbed_kept == 2
    report = out.report()
    assert report["kept"] == 2 and report["discarded"] == 1 and report["disturbed_kept"] == 2
    assert "cap on repeats reached" in out.describe()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="share"):
        load_monitor.LoadMonitor(share=0.0)
    with pytest.raises(ValueError, match="rounds"):
        load_monitor.timed_rounds(lambda k: k, rounds=0, monitor=load_monitor.LoadMonitor(), max_discards=0)
    with pytest.raises(RuntimeError, match="begin"):
        load_monitor.LoadMonitor().end()


def test_bench_torch_repeats_the_rounds_a_busy_process_disturbed():
    """scripts/bench-torch's timing loop: a round with a busy process beside it is thrown away and
    repeated, and only as many rounds as asked for are kept."""
    import torch_bench

    class Step:
        """An 'optimizer' whose step is busy work; the first round it runs in has a busy loop beside it."""

        calls = 0

        def step(self):
            Step.calls += 1
            if Step.calls == 1:
                with BusyLoop():
                    busy(ROUND_S)
            else:
                busy(ROUND_S / 4)

    samples, load = torch_bench.time_steps({"a": Step(), "b": Step()}, warmup=0, rounds=2, progress=False,
                                           monitor=load_monitor.LoadMonitor(), max_discards=2)
    assert [len(v) for v in samples.values()] == [2, 2]
    assert load["kept"] == 2 and load["discarded"] >= 1, load
