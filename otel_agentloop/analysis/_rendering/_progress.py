"""A progress bar on stderr, with an optional live view of the samples still running.

On a terminal the bar and the live view are redrawn in place: through ``rich.live`` when rich (the ``cli``
extra) is installed, else plain ANSI (cursor up, clear to end). Otherwise a plain line is printed every
``live_every_s`` seconds while the step runs, and one when it ends.

Counts add up at every redraw: the done count and the in-flight samples are taken together, the done count
first (a sample leaves the in-flight registry before it is counted done, so done + in flight never exceeds the
total), in flight counts only the step's own samples (others, e.g. a hung sample of an earlier step, are shown
apart), and with a live view the bar is redrawn only with it (never a fresh done beside stale in-flight lines).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...core._guard import internal_error
from ._display import inflight_lines, live_view, rich_console

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live

    from ...core._inflight import InflightSample


class Progress:
    """``advance()`` per finished sample; ``close()`` at the end of the step.

    ``inflight``: a callable returning the running samples (``handle.inflight`` or a Ray gather); with it a
    daemon thread redraws the live view every ``redraw_s`` (terminal) or prints a line every ``live_every_s``.
    ``step``/``validate``: the step the bar counts (in flight then counts its samples only). ``finished``: a
    callable returning how many of the step's samples finished so far, where ``advance()`` lags (Ray workers
    report whole chunks); read before each in-flight snapshot.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        enabled: bool = True,
        inflight: Callable[[], Sequence[InflightSample]] | None = None,
        step: int | None = None,
        validate: bool = False,
        finished: Callable[[], int] | None = None,
        redraw_s: float = 1.0,
        live_every_s: float = 5.0,
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self._shown = 0  # the done count drawn (with the live view: the one read before its in-flight snapshot)
        self.step = step
        self.validate = validate
        self._finished = finished
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self._last = 0.0
        self._drawn = 0  # lines of the last terminal redraw
        self._lock = threading.Lock()
        self._inflight = inflight if enabled else None
        self._extra: list[str] = []  # the live view's lines under the bar
        self._rich = self._start_live() if enabled and self.tty else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._inflight is not None:
            period = redraw_s if self.tty else live_every_s
            self._thread = threading.Thread(target=self._live, args=(period,), name="otel_agentloop.view", daemon=True)
            self._thread.start()

    def advance(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled or not self.tty or self._thread is not None:
            return  # with a live view, its thread redraws the bar with the in-flight lines it goes with
        now = time.perf_counter()
        if now - self._last < 0.05 and self.done < self.total:
            return
        self._last = now
        self._shown = self.done
        try:
            self._draw(self._extra)
        except Exception:
            internal_error("Progress.advance")

    def _bar(self) -> str:
        width = 30
        filled = int(width * min(self._shown, self.total) / self.total)
        return (
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self._shown}/{self.total} "
            f"{time.perf_counter() - self.start:5.1f}s"
        )

    def _start_live(self) -> Live | None:
        """A started ``rich.live.Live`` on stderr, or ``None`` (no rich, or a dumb terminal: plain ANSI)."""
        try:
            console = rich_console(sys.stderr)
            if console is None or console.is_dumb_terminal:
                return None
            from rich.live import Live

            live = Live(
                get_renderable=self._view,
                console=console,
                auto_refresh=False,
                redirect_stdout=False,  # stdout may be a pipe; only stderr shares the screen with the view
            )
            live.start(refresh=True)
            atexit.register(live.stop)  # an interrupted step still gives the cursor and stderr back
            return live
        except Exception:
            internal_error("Progress.live")
            return None

    def _view(self) -> RenderableType:
        return live_view(self.label, self._shown, self.total, time.perf_counter() - self.start, self._extra)

    def _draw(self, extra: list[str]) -> None:
        if self._rich is not None:
            self._extra = extra
            self._rich.refresh()
            return
        with self._lock:
            up = f"\x1b[{self._drawn - 1}F" if self._drawn > 1 else ""
            lines = [self._bar(), *extra]
            sys.stderr.write(up + "\r\x1b[J" + "\n".join(lines))
            sys.stderr.flush()
            self._drawn = len(lines)

    def _done_now(self) -> int:
        if self._finished is not None:
            try:
                return max(int(self._finished()), 0)
            except Exception:  # a worker that does not answer: the count advance() has
                pass
        return self.done

    def _live(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                done = self._done_now()  # first: a sample leaves in-flight before it is counted done
                samples = list(self._inflight())  # type: ignore[misc]
                if self.step is not None:
                    mine = [s for s in samples if s.step == self.step and s.validate == self.validate]
                else:
                    mine = samples
                lines = inflight_lines(mine, others=len(samples) - len(mine))
                self._shown = done
                if self.tty:
                    self._draw(lines)
                else:
                    head = f"{self.label}: {done}/{self.total} done {time.perf_counter() - self.start:.1f}s; "
                    sys.stderr.write(head + "\n".join(lines) + "\n")
                    sys.stderr.flush()
            except Exception:
                internal_error("Progress.live")

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        self._shown = self.done
        if self._rich is not None:
            self._extra = []
            atexit.unregister(self._rich.stop)
            try:
                self._rich.stop()  # a last refresh, then a newline
            except Exception:
                internal_error("Progress.close")
        elif self.tty:
            self._draw([])
            sys.stderr.write("\n")
        else:
            sys.stderr.write(f"{self.label}: {self.done}/{self.total} samples finished in {elapsed:.1f}s\n")
        sys.stderr.flush()
