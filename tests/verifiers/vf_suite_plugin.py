"""A pytest plugin (``-p vf_suite_plugin``) that runs verifiers' own test suite instrumented: tracing configured
(in memory) and ``integrations.verifiers.instrument()`` before any test. At the end, the JSON file named by
``VF_SUITE_SPANS`` gets how many times each of our wrappers ran (each patch's impl counted, test-side) and how
many spans of each name they made."""

from __future__ import annotations

import collections
import inspect
import json
import os
from collections.abc import Callable
from typing import Any

_state: dict[str, Any] = {}
_calls: collections.Counter[str] = collections.Counter()


def _counting(name: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(impl):

        async def counted_async(original: Any, args: Any, kwargs: Any) -> Any:
            _calls[name] += 1
            return await impl(original, args, kwargs)

        return counted_async

    def counted(original: Any, args: Any, kwargs: Any) -> Any:
        _calls[name] += 1
        return impl(original, args, kwargs)

    return counted


def pytest_configure(config: Any) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_agentloop as oal
    from otel_agentloop.integrations import verifiers

    exporter = InMemorySpanExporter()
    _state["exporter"] = exporter
    _state["handle"] = oal.configure("vf-suite", exporters=[exporter], set_global=False)
    verifiers.TARGETS[:] = [(m, c, a, _counting(f"{c or m}.{a}", impl)) for m, c, a, impl in verifiers.TARGETS]
    verifiers.instrument()


def pytest_unconfigure(config: Any) -> None:
    handle = _state.get("handle")
    if handle is None:
        return
    handle.force_flush(5)
    spans = collections.Counter(span.name for span in _state["exporter"].get_finished_spans())
    handle.shutdown(5)
    path = os.environ.get("VF_SUITE_SPANS")
    if path:
        with open(path, "w") as f:
            json.dump({"calls": dict(_calls), "spans": dict(spans)}, f)
