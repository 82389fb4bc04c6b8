"""Recording the user's exceptions on a span (ours, and the SDK's ``record_exception`` event for a record),
and keeping a span's identity under attribute count limits."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Mapping

from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import Attributes, AttributeValue

from .. import semconv as sc
from ._guard import internal_error, safe_str

IDENTITY_KEYS = (sc.RL_PHASE, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_STEP, sc.RL_VALIDATE)
"""What the metrics processor, the keeper and the sampler read: never lost to an attribute count limit."""


def restore_identity(span: Span, started_with: Mapping[str, object]) -> None:
    """Before ``span`` ends: if its attribute count limit evicted anything (the SDK evicts the oldest), write
    back the identity it started with, which makes it the newest. A value the length limit cut is compared as
    cut (it did not change). Costs one check when nothing was dropped."""
    try:
        attrs = span._attributes  # type: ignore[attr-defined]
        if not attrs.dropped:
            return
        limit = attrs.max_value_len
        for key in IDENTITY_KEYS:
            if key not in started_with:
                continue
            value = started_with[key]
            if attrs.get(key) != (value[:limit] if limit is not None and isinstance(value, str) else value):
                span.set_attribute(key, value)  # type: ignore[arg-type]
    except Exception:
        return


MAX_STACK_FRAMES = 32
MAX_STACKTRACE_CHARS = 8192
_RECORDED = "_otel_agentloop_recorded"


def _first_record(exc: BaseException) -> bool:
    """True the first time ``exc`` is recorded: its traceback is formatted once, at the innermost span."""
    try:
        state = object.__getattribute__(exc, "__dict__")
        if state.get(_RECORDED):
            return False
        state[_RECORDED] = True
    except Exception:
        pass
    return True


def _stacktrace(exc: BaseException, message: str) -> str:
    frames = traceback.extract_tb(exc.__traceback__, limit=-MAX_STACK_FRAMES)
    text = "".join(traceback.format_list(frames))
    if len(text) > MAX_STACKTRACE_CHARS:
        text = "…" + text[-MAX_STACKTRACE_CHARS:]
    return f"Traceback (innermost {MAX_STACK_FRAMES} frames at most):\n{text}{error_type(exc)}: {message}"


def error_type(exc: BaseException) -> str:
    """``error.type`` for an exception: the class name, module-qualified unless it is a builtin."""
    cls = type(exc)
    try:
        module, name = str(cls.__module__), str(cls.__qualname__)
    except Exception:
        return "Exception"
    return name if module == "builtins" else f"{module}.{name}"


def mark_error(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span``: ERROR status, ``error.type`` and an ``exception`` event; cancellation is
    noted, not an error. Bounded: the message is cut at 1 KiB and the stack trace (innermost frames, at most
    8 KiB) is formatted once per exception object, at the innermost span it unwinds through, not at every
    level. Never raises, whatever ``exc.__str__`` raises."""
    try:
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            span.set_attribute(sc.RL_CANCELLED, True)
            return
        etype = error_type(exc)
        message = safe_str(exc)
        span.set_attribute(sc.ERROR_TYPE, etype)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"[:256]))
        event: dict[str, AttributeValue] = {
            "exception.type": etype,
            "exception.message": message,
            "exception.escaped": True,
        }
        if _first_record(exc):
            event["exception.stacktrace"] = _stacktrace(exc, message)
        span.add_event("exception", event)
    except Exception:
        internal_error("mark_error")


def exception_event(exception: BaseException, attributes: Attributes, escaped: bool) -> dict[str, AttributeValue]:
    """The attributes of the SDK's ``Span.record_exception`` event for ``exception``, as a record's
    ``record_exception`` (``core._record``) writes it: the module-qualified type, the message (its guarded text
    when ``str()`` raises), the whole stack trace, ``escaped``; then ``attributes``. Raises only what a broken
    ``attributes`` mapping raises."""
    cls = type(exception)
    module, qualname = cls.__module__, cls.__qualname__
    try:
        stack = "".join(traceback.format_exception(exception))
    except Exception:
        stack = ""
    event: dict[str, AttributeValue] = {
        "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
        "exception.message": safe_str(exception, 1 << 20),
        "exception.stacktrace": stack,
        "exception.escaped": str(escaped),
    }
    if attributes:
        event.update(attributes)
    return event
