"""Reading ``OTEL_*`` (and ``OTEL_AGENTLOOP_*``) environment variables.

A bad environment value never stops training: it is reported with a warning that names the variable and
the default used instead. Bad *arguments* to ``configure()`` raise ``ValueError`` naming the parameter.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TypeVar
from urllib.parse import unquote

logger = logging.getLogger("otel_agentloop")
N = TypeVar("N", int, float)

PROTOCOLS = ("grpc", "http/protobuf", "http/json")
DEFAULT_FILE = "otel-agentloop-traces.jsonl"


def env_str(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The stripped value of ``name``, or ``None`` when unset or empty."""
    value = (os.environ if environ is None else environ).get(name)
    value = value.strip() if value is not None else None
    return value or None


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    raw = env_str(name, environ)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    logger.warning("otel_agentloop: %s=%r is not a boolean; using %s", name, raw, str(default).lower())
    return default


def env_number(name: str, default: N, kind: type[N], *, minimum: float = 0, environ: Mapping[str, str] | None = None
               ) -> N:
    """A number from ``name`` that must be ``>= minimum`` (exclusive of 0 when ``minimum`` > 0)."""
    raw = env_str(name, environ)
    if raw is None:
        return default
    try:
        value = kind(float(raw)) if kind is int and raw.replace(".", "", 1).isdigit() else kind(raw)
    except ValueError:
        logger.warning("otel_agentloop: %s=%r is not a number; using %s", name, raw, default)
        return default
    if value < minimum:
        logger.warning("otel_agentloop: %s=%r must be >= %s; using %s", name, raw, minimum, default)
        return default
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str | None,
               environ: Mapping[str, str] | None = None) -> str | None:
    raw = env_str(name, environ)
    if raw is None:
        return default
    if raw.lower() in choices:
        return raw.lower()
    logger.warning("otel_agentloop: %s=%r is not one of %s; using %s", name, raw, ", ".join(choices), default)
    return default


def parse_headers(raw: str | None, source: str) -> dict[str, str]:
    """W3C-baggage-style ``k=v,k2=v2`` headers; malformed items are skipped with a warning."""
    headers: dict[str, str] = {}
    for item in (raw or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            logger.warning("otel_agentloop: ignoring malformed header %r in %s", item.strip(), source)
            continue
        headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers
