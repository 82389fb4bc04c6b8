"""SGLang requests carrying the turn's context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ...core._guard import internal_error


class GenerateRequest(Protocol):
    """What we use of SGLang's ``GenerateReqInput``."""

    external_trace_header: dict[str, str] | None


def with_trace_header(request: GenerateRequest, headers: Mapping[str, str]) -> None:
    """Set SGLang's ``GenerateReqInput.external_trace_header`` to ``headers`` (W3C ``traceparent``, ...) unless
    the request already carries one or ``headers`` is empty. Never raises."""
    if not headers or getattr(request, "external_trace_header", None) is not None:
        return
    try:
        request.external_trace_header = dict(headers)
    except Exception:
        internal_error("sglang.trace_header")
