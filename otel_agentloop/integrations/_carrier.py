"""The carrier a call takes into another process (a Ray actor, a verifiers environment server): the current
trace context (W3C ``traceparent``/``tracestate``) and step (``rl.step``, ``rl.validate``, ``rl.trace_per``), as
a small picklable dict."""

from __future__ import annotations

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import semconv as sc
from ..core import _context

_propagator = TraceContextTextMapPropagator()


def step_carrier() -> dict[str, object]:
    """The current trace context and step; ``{}`` outside both."""
    out: dict[str, object] = {}
    _propagator.inject(out)
    step = _context.current_step()
    if step is not None:
        out[sc.RL_STEP] = step.step
        out[sc.RL_VALIDATE] = step.validate
        out[sc.RL_TRACE_PER] = step.trace_per
    return out
