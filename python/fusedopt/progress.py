"""A one-line progress bar on stderr (no dependency): rewritten in place with a carriage return, at
most ~10 times a second so that drawing it never shows up in step timings."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    WIDTH = 24
    MIN_INTERVAL_S = 0.1

    def __init__(self, total: int | None, label: str = "", enabled: bool | str = True,
                 stream: TextIO | None = None):
        """enabled: True draws only when the stream is a terminal (so logs and pipes stay clean),
        "always" draws anyway, False never."""
        if enabled not in (True, False, "always"):
            raise ValueError(f"progress must be True, False or 'always', got {enabled!r}")
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = enabled == "always" or (enabled is True and isatty)
        self.total, self.label = total, label
        self._last_draw = 0.0
        self._width = 0

    def update(self, done: int, text: str = "", force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last_draw < self.MIN_INTERVAL_S:
            return
        self._last_draw = now
        if self.total:
            filled = min(self.WIDTH, self.WIDTH * done // self.total)
            line = f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total}"
        else:
            line = f"{self.label} {done}"
        line = f"{line} {text}".rstrip()
        # Pad over the previous line's tail: it may have been longer.
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self, done: int, text: str = "") -> None:
        if self.enabled:
            self.update(done, text, force=True)
            self.stream.write("\n")
            self.stream.flush()
