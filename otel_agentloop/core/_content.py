"""Prompt/response text on spans: off unless turned on; when on, redacted then truncated, and counted."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..config._fork import after_fork_in_child
from ..config._settings import Settings, check_int
from ._guard import warn_once

Redactor = Callable[[str], str]
TRUNCATION_MARK = "…[truncated]"


class ContentPolicy:
    """Whether text is captured, how it is cleaned, and how long it may be: one per process (``state.content``),
    set by configure()."""

    DEFAULT_MAX_CHARS = Settings.max_content_chars  # the declaration's default

    def __init__(self) -> None:
        self.enabled = False
        self.max_chars = self.DEFAULT_MAX_CHARS
        self.redact: Redactor | None = None
        self.truncated = 0
        self._lock = threading.Lock()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def set(self, enabled: bool, max_chars: int, redact: Redactor | None) -> None:
        max_chars = check_int("max_content_chars", max_chars, 1)
        self.enabled, self.max_chars, self.redact = enabled, max_chars, redact

    def clean(self, text: object) -> str | None:
        """``text`` redacted and truncated to ``max_chars``, or ``None`` when capture is off or the text cannot
        be made safe: a failing ``__str__``, or a ``redact`` that raises or returns a non-string, drops the text
        (never the unredacted text) with a one-time warning. Never raises."""
        if not self.enabled:
            return None
        try:
            value = text if type(text) is str else str(text)
            if type(value) is not str:
                value = str.__str__(value)
        except Exception:
            warn_once("content-str", "otel_agentloop: content whose str() fails is not captured")
            return None
        if self.redact is not None:
            try:
                redacted: object = self.redact(value)  # a user callable: its declared return type is not trusted
            except Exception:
                warn_once("content-redact", "otel_agentloop: redact raised; content not captured", exc_info=True)
                return None
            if not isinstance(redacted, str):
                warn_once(
                    "content-redact-type",
                    "otel_agentloop: redact returned %s, not str; content not captured",
                    type(redacted).__name__,
                )
                return None
            value = redacted
        if len(value) > self.max_chars:
            with self._lock:
                self.truncated += 1
            value = value[: max(self.max_chars - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK
        return value
