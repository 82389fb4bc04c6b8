"""Prompt/response text on spans: off unless turned on; when on, redacted then truncated, and counted."""

from __future__ import annotations

import threading
from collections.abc import Callable

Redactor = Callable[[str], str]
TRUNCATION_MARK = "…[truncated]"


class ContentPolicy:
    """Whether text is captured, how it is cleaned, and how long it may be. Process-wide, set by configure()."""

    def __init__(self) -> None:
        self.enabled = False
        self.max_chars = 2048
        self.redact: Redactor | None = None
        self.truncated = 0
        self._lock = threading.Lock()

    def set(self, enabled: bool, max_chars: int, redact: Redactor | None) -> None:
        if max_chars < 1:
            raise ValueError(f"max_content_chars must be >= 1, not {max_chars}")
        self.enabled, self.max_chars, self.redact = enabled, max_chars, redact

    def clean(self, text: object) -> str | None:
        """``text`` redacted and truncated to ``max_chars``, or ``None`` when capture is off."""
        if not self.enabled:
            return None
        value = text if isinstance(text, str) else str(text)
        if self.redact is not None:
            value = self.redact(value)
        if len(value) > self.max_chars:
            with self._lock:
                self.truncated += 1
            value = value[: max(self.max_chars - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK
        return value


policy = ContentPolicy()
