"""Notices the timed rounds of a benchmark that other processes disturbed (docs/benchmarks.md, "Load").

A round's time is only this code's time when nothing else ran: on a machine shared with a build, the
same step takes several times as long, and a benchmark that keeps those rounds reports the load, not
the code. For each round, LoadMonitor measures the CPU time the rest of the machine took during it:
/proc/stat's busy time over all CPUs (user, nice, system, irq, softirq and steal: a VM's host taking
the CPU counts too) minus this process's own (utime + stime of /proc/self/stat, every thread, in the
same clock ticks), and the 1-minute load average at its end. A round in which the others took more
than `share` of the machine (wall time x CPUs) is disturbed. `timed_rounds` throws disturbed rounds
away and repeats them, up to a cap, and says how many it threw away and how many it had to keep.

Linux only (/proc): elsewhere `available` is False and no round is flagged.
"""

from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
# /proc/stat's per-CPU times are sampled at ticks while a process's own times are exact sums, so a
# round's difference is off by a tick or so either way; below this many ticks of others' CPU a round
# is never flagged, however short.
NOISE_TICKS = 2
DEFAULT_SHARE = 0.05  # others may take up to 5% of the machine during a round
_PROC_STAT = pathlib.Path("/proc/stat")
_SELF_STAT = pathlib.Path("/proc/self/stat")


def _busy_ticks_and_cpus() -> tuple[int, int]:
    """(busy ticks of all CPUs since boot, online CPU count) from /proc/stat."""
    lines = _PROC_STAT.read_text().splitlines()
    # cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in lines[0].split()[1:9])
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3].isdigit())
    return user + nice + system + irq + softirq + steal, cpus


def own_ticks() -> int:
    """utime + stime of this process (all its threads) in clock ticks."""
    # The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
    fields = _SELF_STAT.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


@dataclass(frozen=True)
class RoundLoad:
    """What the rest of the machine did during one round."""

    wall_s: float
    others_cpu_s: float  # CPU seconds other processes (and the VM's host) took during the round
    others_share: float  # others_cpu_s / (wall_s * cpus)
    loadavg: float  # the 1-minute load average at the round's end
    disturbed: bool


class LoadMonitor:
    """begin() before a round, end() after it; end() returns the round's RoundLoad."""

    def __init__(self, share: float = DEFAULT_SHARE):
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.share = share
        self.available = _PROC_STAT.exists() and _SELF_STAT.exists()
        self.cpus = _busy_ticks_and_cpus()[1] if self.available else (os.cpu_count() or 1)
        self._start: tuple[float, int, int] | None = None

    def begin(self) -> None:
        busy = _busy_ticks_and_cpus()[0] if self.available else 0
        own = own_ticks() if self.available else 0
        self._start = (time.perf_counter(), busy, own)

    def end(self, peers_ticks: int = 0) -> RoundLoad:
        """peers_ticks: CPU ticks that processes of this benchmark other than this one (its other ranks) took
        during the round, which are the benchmark's own time, not others'."""
        if self._start is None:
            raise RuntimeError("LoadMonitor.end() without begin()")
        wall = time.perf_counter() - self._start[0]
        loadavg = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if not self.available:
            return RoundLoad(wall, 0.0, 0.0, loadavg, False)
        busy = _busy_ticks_and_cpus()[0] - self._start[1]
        own = own_ticks() - self._start[2] + peers_ticks
        others_ticks = max(0, busy - own)
        others = others_ticks * TICK_S
        disturbed = others_ticks >= NOISE_TICKS and others > self.share * wall * self.cpus
        return RoundLoad(wall, others, others / (wall * self.cpus), loadavg, disturbed)


T = TypeVar("T")


@dataclass
class Rounds(Generic[T]):
    """The kept rounds' results and loads, and how many disturbed rounds were thrown away."""

    results: list[T] = field(default_factory=list)
    loads: list[RoundLoad] = field(default_factory=list)
    discarded: int = 0

    @property
    def disturbed_kept(self) -> int:
        """Disturbed rounds kept because the cap on discards was reached."""
        return sum(load.disturbed for load in self.loads)

    def report(self) -> dict:
        """The JSON summary: counts, others' share of the machine and the load average (min, max)."""
        shares = [load.others_share for load in self.loads]
        loadavgs = [load.loadavg for load in self.loads]
        return {"kept": len(self.results), "discarded": self.discarded, "disturbed_kept": self.disturbed_kept,
                "others_share_max": max(shares, default=0.0),
                "loadavg_min": min(loadavgs, default=0.0), "loadavg_max": max(loadavgs, default=0.0)}

    def describe(self) -> str:
        r = self.report()
        text = (f"{r['kept']} rounds kept, {r['discarded']} disturbed rounds thrown away; load average "
                f"{r['loadavg_min']:.2f}-{r['loadavg_max']:.2f}")
        if r["disturbed_kept"]:
            text += f"; {r['disturbed_kept']} disturbed rounds kept (cap on repeats reached): the machine is not quiet"
        return text


def timed_rounds(run_round: Callable[[int], T], rounds: int, monitor: LoadMonitor,
                 max_discards: int) -> Rounds[T]:
    """Runs run_round(k) until `rounds` rounds are kept, k counting the kept rounds (so an order
    design over k stays balanced). A disturbed round is thrown away and repeated while fewer than
    `max_discards` have been; after that, disturbed rounds are kept (and counted as such)."""
    if rounds < 1 or max_discards < 0:
        raise ValueError(f"rounds must be >= 1 and max_discards >= 0, got {rounds} and {max_discards}")
    out: Rounds[T] = Rounds()
    while len(out.results) < rounds:
        monitor.begin()
        result = run_round(len(out.results))
        load = monitor.end()
        if load.disturbed and out.discarded < max_discards:
            out.discarded += 1
            continue
        out.results.append(result)
        out.loads.append(load)
    return out
