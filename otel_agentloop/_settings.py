"""Reading ``OTEL_*`` (and ``OTEL_AGENTLOOP_*``) environment variables.

A bad environment value never stops training: it is reported with a warning that names the variable and
the default used instead. Bad *arguments* to ``configure()`` raise ``ValueError`` naming the parameter.
"""

from __future__ import annotations

import logging
import math
import operator
import os
from collections.abc import Mapping
from typing import TypeVar
from urllib.parse import unquote

logger = logging.getLogger("otel_agentloop")
N = TypeVar("N", int, float)

PROTOCOLS = ("grpc", "http/protobuf", "http/json")
DEFAULT_FILE = "otel-agentloop-traces.jsonl"
MAX_SECONDS = 3600.0
"""Upper bound of every duration setting (schedule delay, export and flush timeouts): longer waits overflow
``threading`` timeouts or stall export for good."""
MAX_QUEUE = 1 << 24
MAX_COUNT = 1 << 40


def check_int(name: str, value: object, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (ints and numpy ints; not bools, floats or strings), else
    ``ValueError`` naming the setting."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, not {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an int, not {type(value).__name__} {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {number}")
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, not {number}")
    return number


def check_seconds(
    name: str, value: object, *, minimum: float = 0.0, inclusive: bool = False, maximum: float = MAX_SECONDS
) -> float:
    """``value`` as finite seconds above ``minimum`` (or equal, with ``inclusive``) and at most ``maximum``,
    else ``ValueError`` naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, not {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, not {number}")
    if not (number >= minimum if inclusive else number > minimum):
        raise ValueError(f"{name} must be {'>=' if inclusive else '>'} {minimum:g}, not {number:g}")
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum:g} seconds, not {number:g}")
    return number


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


def env_number(
    name: str,
    default: N,
    kind: type[N],
    *,
    minimum: float = 0,
    maximum: float = MAX_COUNT,
    environ: Mapping[str, str] | None = None,
) -> N:
    """A finite number from ``name`` in ``[minimum, maximum]``; anything else warns, naming the variable, and
    gives ``default``."""
    raw = env_str(name, environ)
    if raw is None:
        return default
    try:
        as_float = float(raw)
        if not math.isfinite(as_float):
            raise ValueError(raw)
        value = kind(as_float) if kind is int else kind(raw)
    except (ValueError, OverflowError):
        logger.warning("otel_agentloop: %s=%r is not a finite number; using %s", name, raw, default)
        return default
    if not minimum <= value <= maximum:
        logger.warning(
            "otel_agentloop: %s=%r must be between %s and %s; using %s", name, raw, minimum, maximum, default
        )
        return default
    return value


def env_choice(
    name: str, choices: tuple[str, ...], default: str | None, environ: Mapping[str, str] | None = None
) -> str | None:
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
