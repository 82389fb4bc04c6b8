"""A tiny progress bar on stderr (no dependency); plain lines when stderr is not a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled or not self.tty:
            return
        now = time.perf_counter()
        if now - self._last < 0.05 and self.done < self.total:
            return
        self._last = now
        width = 30
        filled = int(width * self.done / self.total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{now - self.start:5.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        if self.tty:
            sys.stderr.write("\n")
        else:
            sys.stderr.write(f"{self.label}: {self.done}/{self.total} samples in {elapsed:.1f}s\n")
        sys.stderr.flush()
