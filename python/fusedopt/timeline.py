"""Training timelines as Chrome trace-event JSON (docs/trace-format.md): open the file in
https://ui.perfetto.dev or chrome://tracing, or read it back with `fusedopt doctor --trace FILE`.

One Tracer collects the spans of one or more optimizer implementations (one trace process per
implementation, `otherData.impls` maps its pid to torch / foreach / torch_fused / fused) and writes
them in one file, so a benchmark that alternates implementations step by step shows them side by
side on one time axis::

    tracer = Tracer({"model": "mobilenet_v1", "optimizer": "adamw", ...})
    pid = tracer.add_process("fused", "fusedopt.FusedAdamW")
    with tracer.span(pid, "forward", step=3):
        ...
    tracer.write("trace.json")
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

IMPL_KINDS = ("torch", "foreach", "torch_fused", "fused")
SPAN_NAMES = ("step", "data", "forward", "backward", "optimizer", "pre_pass", "zero_grad", "communication",
              "checkpoint")
TRAINING_THREAD = 1  # docs/trace-format.md: tid 1 is the training thread


class Tracer:
    """Collects complete ("X") events with timestamps in microseconds since the tracer was made."""

    def __init__(self, other_data: dict[str, Any] | None = None):
        self.origin = time.perf_counter()
        self.other_data: dict[str, Any] = {"fusedopt_trace": 1, **(other_data or {})}
        self.other_data.setdefault("impls", {})
        self._events: list[dict[str, Any]] = []

    def add_process(self, impl: str, label: str) -> int:
        """A new trace process for one optimizer implementation; returns its pid (1, 2, ...)."""
        if impl not in IMPL_KINDS:
            raise ValueError(f"impl must be one of {IMPL_KINDS}, got {impl!r}")
        pid = len(self.other_data["impls"]) + 1
        self.other_data["impls"][str(pid)] = impl
        self._events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        return pid

    def now_us(self) -> float:
        return (time.perf_counter() - self.origin) * 1e6

    def to_us(self, perf_counter_s: float) -> float:
        """A time.perf_counter() reading as the trace's microseconds."""
        return (perf_counter_s - self.origin) * 1e6

    def add_span(self, pid: int, name: str, start_s: float, end_s: float, **args: Any) -> None:
        """A span from two time.perf_counter() readings (so callers that time phases anyway pay
        nothing extra). args: `step` (0-based index) and, on `step` spans, `warmup`."""
        if name not in SPAN_NAMES:
            raise ValueError(f"span name must be one of {SPAN_NAMES}, got {name!r}")
        self._events.append({"name": name, "cat": "train", "ph": "X", "pid": pid, "tid": TRAINING_THREAD,
                             "ts": round(self.to_us(start_s), 3), "dur": round((end_s - start_s) * 1e6, 3),
                             "args": args})

    @contextlib.contextmanager
    def span(self, pid: int, name: str, **args: Any) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_span(pid, name, start, time.perf_counter(), **args)

    def to_json(self) -> dict[str, Any]:
        return {"displayTimeUnit": "ms", "otherData": self.other_data, "traceEvents": list(self._events)}

    def write(self, path: str | os.PathLike) -> None:
        """Writes the whole trace so far (atomically: a reader never sees half a file)."""
        path = os.fspath(path)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f)
            f.write("\n")
        os.replace(tmp, path)
