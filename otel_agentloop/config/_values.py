"""The values settings are made of: checks of ``configure()`` arguments, parsers of environment text, the one
range rule for durations, pairs, endpoints and watchdog thresholds. No declaration here (see ``_settings``)."""

from __future__ import annotations

import ipaddress
import logging
import math
import operator
import os
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from .. import semconv as sc
from ._fork import renew_lock

logger = logging.getLogger("otel_agentloop")
_OTLP = "OTEL_EXPORTER_OTLP_"

MAX_SECONDS = 3600.0
"""Upper bound of every duration setting (schedule delay, export and flush timeouts): longer waits overflow
``threading`` timeouts or stall export for good."""
MAX_QUEUE = 1 << 24
MAX_COUNT = 1 << 40
MAX_WATCHDOG_SECONDS = 7 * 86400.0
"""Upper bound of every watchdog duration (thresholds, learned floor, default): a week. Larger values overflow
the nanosecond arithmetic and mean "never" anyway."""
MIN_WATCHDOG_INTERVAL = 0.05
"""Lower bound of the watchdog's check interval: below it the thread costs CPU without seeing more."""


class AdjustedError(ValueError):
    """An environment value out of its declared range: ``value`` (the nearest bound) is used instead."""

    def __init__(self, reason: str, value: Any) -> None:  # Any: the setting's own type (as Spec.show takes it)
        super().__init__(reason)
        self.value = value


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


def number_text(value: float) -> str:
    """``value`` as a variable writes it: ``5`` for 5.0, ``0.25`` for 0.25."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def positive_number(raw: str, *, maximum: float, minimum: float = 0.0, scale: float = 1.0, unit: str = "") -> float:
    """The one range rule of environment durations: ``raw`` divided by ``scale`` as a finite number > 0, in
    ``[minimum, maximum]``. Not a finite number, 0 or negative: ``ValueError`` (the caller uses its default);
    above ``maximum`` or below ``minimum``: :class:`AdjustedError` carrying that bound (the caller uses it).
    Messages give the bounds in the variable's own unit (``scale``; ``unit`` is appended)."""
    try:
        number = float(raw) / scale
    except ValueError:
        raise ValueError("is not a finite number") from None
    if not math.isfinite(number):
        raise ValueError("is not a finite number")
    if not number > 0:
        raise ValueError("must be > 0")
    if number > maximum:
        raise AdjustedError(f"must be at most {number_text(maximum * scale)}{unit}", maximum)
    if number < minimum:
        raise AdjustedError(f"must be at least {number_text(minimum * scale)}{unit}", minimum)
    return number


# -- watchdog thresholds ----------------------------------------------------------------------------
_ALIASES = {
    "generate": sc.GENERATE,
    "tool": sc.TOOL_CALLS,
    "tool_call": sc.TOOL_CALLS,
    "reward": sc.COMPUTE_SCORE,
    **{p: p for p in sc.PHASES},
}
ThresholdKey = tuple[str, str | None]


def parse_thresholds(spec: Mapping[str, float] | str | None) -> dict[ThresholdKey, float]:
    """``{"tool_calls": 60, "tool:python": 300}`` or ``"tool_calls=60,tool:python=300"`` -> keyed seconds.

    Keys: a phase (``generate_sequences``, ``tool_calls``, ``compute_score`` or an alias) or ``tool:NAME``.
    Raises ``ValueError`` on an unknown key or a value that is not a positive number.
    """
    if spec is None:
        return {}
    items: list[tuple[str, Any]]  # Any: the user's threshold values, read by float()
    if isinstance(spec, str):
        items = []
        for part in spec.split(","):
            if part.strip():
                key, sep, value = part.partition("=")
                if not sep:
                    raise ValueError(f"watchdog threshold {part.strip()!r} is not KEY=SECONDS")
                items.append((key.strip(), value.strip()))
    else:
        items = list(spec.items())
    out: dict[ThresholdKey, float] = {}
    for key, value in items:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"watchdog threshold for {key!r} must be a number of seconds, not {value!r}") from None
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError(f"watchdog threshold for {key!r} must be > 0 seconds, not {value!r}")
        if seconds > MAX_WATCHDOG_SECONDS:
            raise ValueError(
                f"watchdog threshold for {key!r} must be at most {MAX_WATCHDOG_SECONDS:g} seconds, not {value!r}"
            )
        if key.startswith("tool:") and key[5:]:
            out[(sc.TOOL_CALLS, key[5:])] = seconds
        elif key in _ALIASES:
            out[(_ALIASES[key], None)] = seconds
        else:
            raise ValueError(f"unknown watchdog threshold key {key!r}: a phase ({', '.join(sc.PHASES)}) or tool:NAME")
    return out


def format_thresholds(parsed: Mapping[ThresholdKey, float]) -> str:
    """Parsed thresholds as ``OTEL_AGENTLOOP_WATCHDOG_THRESHOLDS`` text (``tool:NAME=S`` or ``PHASE=S``)."""
    return ",".join(f"{phase if tool is None else 'tool:' + tool}={value!r}" for (phase, tool), value in parsed.items())


TRUE_TEXT = ("true", "1", "yes", "on")
"""What a boolean variable may say for true (any case); :data:`FALSE_TEXT` for false."""
FALSE_TEXT = ("false", "0", "no", "off")


def split_pairs(raw: str | None, *, lower: bool = True) -> tuple[dict[str, str], list[str]]:
    """W3C-baggage-style ``k=v,k2=v2`` (percent-decoded) -> (the pairs, the malformed items)."""
    pairs: dict[str, str] = {}
    malformed: list[str] = []
    for item in (raw or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            malformed.append(item.strip())
            continue
        key = unquote(key.strip())
        pairs[key.lower() if lower else key] = unquote(value.strip())
    return pairs, malformed


def parse_pairs(raw: str | None, source: str, *, lower: bool = True) -> dict[str, str]:
    """W3C-baggage-style ``k=v,k2=v2`` (percent-decoded); malformed items are skipped with a warning."""
    pairs, malformed = split_pairs(raw, lower=lower)
    for item in malformed:
        logger.warning("otel_agentloop: ignoring malformed item %r in %s", item, source)
    return pairs


def parse_headers(raw: str | None, source: str) -> dict[str, str]:
    """W3C-baggage-style ``k=v,k2=v2`` headers (names lowercased); malformed items are skipped with a warning."""
    return parse_pairs(raw, source)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _insecure_from_env() -> bool | None:
    for var in (_OTLP + "TRACES_INSECURE", _OTLP + "INSECURE"):
        raw = env_str(var)
        if raw is not None and raw.lower() in TRUE_TEXT + FALSE_TEXT:
            return raw.lower() in TRUE_TEXT
    return None


def parse_endpoint(raw: str) -> str:
    """An OTLP endpoint URL (``http://`` or ``https://``, a host, a valid port), else ``ValueError``.

    Without a scheme (``127.0.0.1:4317``) it raises :class:`AdjustedError` with the URL used instead: ``http://``
    for a loopback host, else as ``OTEL_EXPORTER_OTLP_(TRACES_)INSECURE`` says (``https://`` unless it is
    true), so a plaintext Collector on this node never gets a TLS handshake and a remote one is never sent
    headers in plaintext unless asked."""
    text = raw.strip()
    if "://" not in text:
        host = urlsplit("//" + text).hostname or ""
        insecure = _insecure_from_env()
        scheme = "http" if (insecure if insecure is not None else _is_loopback(host)) else "https"
        url = parse_endpoint(f"{scheme}://{text}")
        raise AdjustedError("has no scheme (write http:// for plaintext, https:// for TLS)", url)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (raises ValueError for a port out of range or not a number)
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    host = parts.hostname or ""
    if not (_HOST.fullmatch(host) or (":" in host and _is_ip(host))):
        raise ValueError("has no valid host")
    return text


_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- the process's one warn-once registry (core._guard re-exports it) ---------------------------------
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object, exc_info: bool = False) -> None:
    """Log ``message % args`` at WARNING the first time ``key`` is seen in this process; later calls are free
    (see :func:`forget_warnings`)."""
    if key in _warned:
        return
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args, exc_info=exc_info)


def forget_warnings() -> None:
    """Warn again about what :func:`warn_once` already reported (``testing.isolated`` and ``testing.reset``)."""
    with _warned_lock:
        _warned.clear()


renew_lock(globals(), "_warned_lock")  # registered first of all: any later hook may warn
