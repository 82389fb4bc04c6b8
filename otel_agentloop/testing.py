"""Test helpers: configure with an in-memory exporter, isolate and reset this library's process state.

::

    from otel_agentloop import testing

    def test_rollout():
        with testing.capture() as captured:        # configure() with an in-memory exporter, shut down after
            run_my_rollout()
        assert captured.by_name("rl.sample")

In a pytest ``conftest.py``, an autouse fixture that runs each test inside :func:`isolated` keeps tests from
seeing each other's configuration and from the outer environment's ``OTEL_*`` variables.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from .core._guard import forget_warnings
from .core._state import state
from .setup import Handle, configure

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .config._options import Options

__all__ = ["Captured", "capture", "configure_for_tests", "isolated", "reset"]


@dataclass
class Captured:
    """A handle whose spans go to ``exporter`` (in memory)."""

    handle: Handle
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        """Every span ended so far (flushed first)."""
        assert self.handle.force_flush(5), "spans were still queued after 5 s"
        return list(self.exporter.get_finished_spans())

    def by_name(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]


def configure_for_tests(service_name: str = "test", **kwargs: Unpack[Options]) -> Captured:
    """``configure()`` exporting to memory only, not installed as the global provider, exporting every 50 ms.
    ``kwargs`` go to ``configure()`` (and may override those choices)."""
    exporter = InMemorySpanExporter()
    options: Options = {"exporters": [exporter], "set_global": False, "schedule_delay_s": 0.05}
    options.update(kwargs)
    return Captured(configure(service_name, **options), exporter)


@contextlib.contextmanager
def capture(service_name: str = "test", **kwargs: Unpack[Options]) -> Generator[Captured, None, None]:
    """:func:`configure_for_tests` for the ``with`` block; the handle is shut down at its end."""
    captured = configure_for_tests(service_name, **kwargs)
    try:
        yield captured
    finally:
        captured.handle.shutdown(5)


@contextlib.contextmanager
def isolated() -> Generator[None, None, None]:
    """Run the block without the outer ``OTEL_*`` environment and with once-only warnings forgotten; afterwards
    put back the environment and the process state (installed provider, disabled flag, content policy,
    defaults) as they were before the block: not a blank state, so an outer fixture's configuration stays."""
    outer_env = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    for key in outer_env:
        del os.environ[key]
    saved = state.save()
    handle, worker_handle = state.handle, state.worker_handle
    forget_warnings()
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("OTEL_")]:
            del os.environ[key]
        os.environ.update(outer_env)
        state.restore(saved)
        state.handle, state.worker_handle = handle, worker_handle


def reset() -> None:
    """Return this process to how it was at import: see :meth:`ProcessState.reset
    <otel_agentloop.core._state.ProcessState.reset>`."""
    state.reset()
