"""A pytest plugin (``-p vf_suite_plugin``) that runs verifiers' own test suite instrumented: tracing configured
(in memory) and ``integrations.verifiers.instrument()`` before any test; at the end, how many spans of each name
our wrappers made goes to the JSON file named by ``VF_SUITE_SPANS``."""

from __future__ import annotations

import collections
import json
import os
from typing import Any

_state: dict[str, Any] = {}


def pytest_configure(config: Any) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_agentloop as oal
    from otel_agentloop.integrations import verifiers

    exporter = InMemorySpanExporter()
    _state["exporter"] = exporter
    _state["handle"] = oal.configure("vf-suite", exporters=[exporter], set_global=False)
    verifiers.instrument()


def pytest_unconfigure(config: Any) -> None:
    handle = _state.get("handle")
    if handle is None:
        return
    handle.force_flush(5)
    counts = collections.Counter(span.name for span in _state["exporter"].get_finished_spans())
    handle.shutdown(5)
    path = os.environ.get("VF_SUITE_SPANS")
    if path:
        with open(path, "w") as f:
            json.dump(dict(counts), f)
