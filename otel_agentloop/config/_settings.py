"""Every setting, declared once (:class:`Settings`), and reading ``OTEL_*``/``OTEL_AGENTLOOP_*`` variables.

Each :class:`Settings` field carries its environment variable, default, parser, argument validator and
formatter (:class:`Spec`). From that one declaration come the defaults, reading the environment
(:func:`resolve`), merging ``configure()`` arguments, and the environment handed to other processes (Ray
workers) so that their ``configure()`` resolves the same settings (:meth:`Settings.worker_env`).

A bad environment value never stops training: it is reported with a warning that names the variable and
the default used instead. Bad *arguments* to ``configure()`` raise ``ValueError`` naming the parameter.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import operator
import os
import re
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from .. import semconv as sc

logger = logging.getLogger("otel_agentloop")

PROTOCOLS = ("grpc", "http/protobuf", "http/json")
DEFAULT_FILE = "otel-agentloop-traces.jsonl"
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

    def __init__(self, reason: str, value: Any) -> None:
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
    items: list[tuple[str, Any]]
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


# -- the declaration ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Spec:
    """How one :class:`Settings` field is read, validated and written.

    ``parse`` turns environment text into a value (``ValueError`` with the reason when it cannot); ``check``
    validates a ``configure()`` argument (``ValueError`` naming the setting); ``show`` writes a value as text
    that ``parse`` reads back equal. ``env`` is the variable written for other processes; ``read`` lists more
    specific variables read before it (first set and valid wins). ``example`` is a valid non-default value
    (the tests set every setting to it).
    """

    env: str
    parse: Callable[[str], Any]
    check: Callable[[str, Any], Any]
    show: Callable[[Any], str]
    example: Any
    read: tuple[str, ...] = ()
    merge: bool = False
    """A mapping whose argument is merged over the environment's (resource attributes), not instead of it."""
    unset: str = "none"
    """What a ``None`` default means, in words (for warnings: "using no OTLP endpoint ...")."""

    def describe(self, value: Any) -> str:
        """``value`` as a warning names it: its text, or :attr:`unset` for ``None``."""
        return self.unset if value is None else self.show(value)


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _parse_int(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            as_float = float(raw)
        except ValueError:
            raise ValueError("is not a finite number") from None
        if not math.isfinite(as_float):
            raise ValueError("is not a finite number")
        if not minimum <= as_float <= maximum:  # a count out of range: the default, never a huge bound
            raise ValueError(f"must be between {minimum} and {maximum}")
        return int(as_float)

    return parse


def _int(example: int, minimum: int = 0, maximum: int = MAX_COUNT) -> dict[str, Any]:
    def check(name: str, value: object) -> int:
        return check_int(name, value, minimum, maximum)

    return {
        "parse": _parse_int(minimum, maximum),
        "check": check,
        "show": str,
        "example": example,
    }


def _budget(example: int) -> dict[str, Any]:
    """A count where the environment's ``-1`` means "no limit" (``None``)."""
    parse_int = _parse_int(-1, MAX_COUNT)

    def parse(raw: str) -> int | None:
        value = parse_int(raw)
        return None if value < 0 else value

    def check(name: str, value: object) -> int:
        return check_int(name, value)

    return {
        "parse": parse,
        "check": check,
        "show": str,
        "example": example,
    }


def _seconds(
    example: float, *, millis: bool = False, minimum: float = 0.0, maximum: float = MAX_SECONDS
) -> dict[str, Any]:
    """Seconds > 0, in ``[minimum, maximum]``; ``millis``: the variable holds milliseconds (``OTEL_BSP_*``).
    From the environment, 0, a negative or a non-finite value gives the default; a positive value out of
    range gives the nearest bound (both with a warning)."""
    scale = 1000.0 if millis else 1.0

    def parse(raw: str) -> float:
        try:
            number = float(raw) / scale
        except ValueError:
            raise ValueError("is not a finite number") from None
        if not math.isfinite(number):
            raise ValueError("is not a finite number")
        if not number > 0:
            raise ValueError("must be > 0")
        if number > maximum:
            raise AdjustedError(f"must be at most {_number_text(maximum * scale)}", maximum)
        if number < minimum:
            raise AdjustedError(f"must be at least {_number_text(minimum * scale)}", minimum)
        return number

    def check(name: str, value: object) -> float:
        number = check_seconds(name, value, maximum=maximum)
        if number < minimum:
            raise ValueError(f"{name} must be >= {minimum:g} seconds, not {number:g}")
        return number

    def show(value: float) -> str:
        return _number_text(value * scale)

    return {
        "parse": parse,
        "check": check,
        "show": show,
        "example": example,
    }


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _check_bool(name: str, value: object) -> bool:
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be a bool, not {value!r}")


def _bool(example: bool, *, inverted: bool = False) -> dict[str, Any]:
    """A boolean; ``inverted``: the variable says the opposite (``OTEL_SDK_DISABLED`` for ``enabled``)."""

    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered not in _TRUE + _FALSE:
            raise ValueError("is not a boolean")
        return (lowered in _TRUE) != inverted

    def show(value: bool) -> str:
        return str(bool(value) != inverted).lower()

    return {
        "parse": parse,
        "check": _check_bool,
        "show": show,
        "example": example,
    }


def _choice(example: str, choices: tuple[str, ...]) -> dict[str, Any]:
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"is not one of {', '.join(choices)}")
        return raw.lower()

    def check(name: str, value: object) -> str:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        return str(value)

    return {"parse": parse, "check": check, "show": str, "example": example}


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, not {value!r}")
    return value


def _text(example: str) -> dict[str, Any]:
    return {"parse": str, "check": _check_text, "show": str, "example": example}


def _check_path(name: str, value: object) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path, not {type(value).__name__} {value!r}")
    return os.path.abspath(os.fsdecode(value))


def _path(example: str) -> dict[str, Any]:
    """A file path, made absolute in the process that resolves it (so workers write the driver's file)."""
    return {"parse": os.path.abspath, "check": _check_path, "show": str, "example": example}


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


def _pairs(example: Mapping[str, str], *, headers: bool) -> dict[str, Any]:
    """A mapping written as ``k=v,...``; headers have lowercased names and string values. Resource attribute
    values that are not strings reach other processes as their ``str()``."""

    def parse(raw: str) -> dict[str, str] | None:
        pairs, malformed = split_pairs(raw, lower=headers)
        if malformed:
            raise AdjustedError(f"has items that are not key=value: {', '.join(map(repr, malformed))}", pairs or None)
        return pairs or None

    def check(name: str, value: object) -> dict[str, Any]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"{name} must be a mapping with string keys, not {type(value).__name__}")
        if headers:
            return {k.lower(): str(v) for k, v in value.items()}
        return dict(value)

    def show(value: Mapping[str, Any]) -> str:
        # errors="replace": a lone surrogate (os.fsdecode of a non-UTF-8 name) must not stop configure()
        return ",".join(
            f"{quote(str(k), safe='', errors='replace')}={quote(str(v), safe='', errors='replace')}"
            for k, v in value.items()
        )

    return {"parse": parse, "check": check, "show": show, "example": dict(example)}


def _thresholds(example: str) -> dict[str, Any]:
    """Watchdog thresholds, kept as their canonical text (a mapping or text argument is parsed and rewritten)."""

    def canonical(value: Mapping[str, float] | str) -> str | None:
        return format_thresholds(parse_thresholds(value)) or None

    def check(name: str, value: object) -> str | None:
        if not isinstance(value, (str, Mapping)):
            raise ValueError(f"{name} must be a mapping or KEY=SECONDS text, not {type(value).__name__}")
        return canonical(value)

    return {"parse": canonical, "check": check, "show": str, "example": example}


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
        if raw is not None and raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
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


def _endpoint(example: str) -> dict[str, Any]:
    def check(name: str, value: object) -> str:
        text = _check_text(name, value)
        try:
            return parse_endpoint(text)
        except AdjustedError as exc:
            logger.warning("otel_agentloop: %s=%r %s; using %s", name, text, exc, exc.value)
            return str(exc.value)
        except ValueError as exc:
            raise ValueError(f"{name} {text!r} {exc}") from None

    return {"parse": parse_endpoint, "check": check, "show": str, "example": example}


def _setting(
    default: Any, env: str, *, read: tuple[str, ...] = (), merge: bool = False, unset: str = "none", **kind: Any
) -> Any:
    spec = Spec(env=env, read=read, merge=merge, unset=unset, **kind)
    return dataclasses.field(default=default, metadata={"spec": spec})


_OTLP = "OTEL_EXPORTER_OTLP_"
_AL = "OTEL_AGENTLOOP_"
TRACE_EXPORTERS = ("otlp", "none", "console")


@dataclasses.dataclass(frozen=True)
class Settings:
    """This process's resolved settings: ``configure()`` arguments, else the environment, else the default.

    Read it as ``handle.settings``. ``sources`` says where each non-default came from (``"argument"`` or the
    variable's name). Fields that are objects rather than settings (``exporters``, ``processors``,
    ``sampler``, ``redact``, ``metric_readers``) and the per-process ``worker`` name are not here: they
    cannot travel to another process as environment variables.
    """

    # exporting
    service_name: str | None = _setting(None, "OTEL_SERVICE_NAME", **_text("svc"))
    endpoint: str | None = _setting(
        None,
        _OTLP + "ENDPOINT",
        read=(_OTLP + "TRACES_ENDPOINT",),
        unset=f"no OTLP endpoint (spans go to ./{DEFAULT_FILE})",
        **_endpoint("http://127.0.0.1:9"),
    )
    """OTLP endpoint; ``None``: no OTLP export."""
    protocol: str = _setting(
        "grpc", _OTLP + "PROTOCOL", read=(_OTLP + "TRACES_PROTOCOL",), **_choice("http/json", PROTOCOLS)
    )
    headers: Mapping[str, str] | None = _setting(
        None,
        _OTLP + "HEADERS",
        read=(_OTLP + "TRACES_HEADERS",),
        unset="no headers",
        **_pairs({"x-team": "rl a"}, headers=True),
    )
    file: str | None = _setting(
        None, _AL + "FILE", unset=f"./{DEFAULT_FILE}", **_path("/tmp/otel-agentloop-example.jsonl")
    )
    """The OTLP-JSON-lines file (absolute); used when there is no OTLP endpoint, or with ``also_file``."""
    also_file: bool = _setting(False, _AL + "ALSO_FILE", **_bool(True))
    """Write ``file`` even when exporting over OTLP (implied by a ``file`` argument)."""
    traces_exporter: str = _setting("otlp", "OTEL_TRACES_EXPORTER", **_choice("none", TRACE_EXPORTERS))
    resource_attributes: Mapping[str, Any] | None = _setting(
        None, "OTEL_RESOURCE_ATTRIBUTES", merge=True, **_pairs({"deployment.environment": "test"}, headers=False)
    )
    attribute_value_length_limit: int = _setting(4096, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", **_int(100, 1))
    # the run (resource attributes rl.run.id, rl.run.attempt)
    run_id: str | None = _setting(
        None, _AL + "RUN_ID", unset="generated once by the driver", **_text("20261123T221500Z-3f9a1c")
    )
    """The training run, on every span's resource (``rl.run.id``). Give the same one to a resumed run;
    unset, the driver generates one (UTC time + 6 random hex digits) and hands it to its workers."""
    run_attempt: str | None = _setting(
        None, _AL + "RUN_ATTEMPT", unset="generated at each driver launch", **_text("20261123T221500Z-77e0b2")
    )
    """One launch of the run's driver (``rl.run.attempt``): generated by the driver, handed to its workers."""
    # tracing
    enabled: bool = _setting(True, "OTEL_SDK_DISABLED", **_bool(False, inverted=True))
    set_global: bool = _setting(True, _AL + "SET_GLOBAL", **_bool(False))
    trace_per: str = _setting("sample", _AL + "TRACE_PER", **_choice("step", ("sample", "step")))
    # export queue
    max_queue_size: int = _setting(2048, "OTEL_BSP_MAX_QUEUE_SIZE", **_int(1000, 1, MAX_QUEUE))
    max_export_batch_size: int = _setting(512, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", **_int(100, 1, MAX_QUEUE))
    schedule_delay_s: float = _setting(1.0, "OTEL_BSP_SCHEDULE_DELAY", **_seconds(0.25, millis=True))
    export_timeout_s: float = _setting(30.0, "OTEL_BSP_EXPORT_TIMEOUT", **_seconds(7.0, millis=True))
    otlp_timeout_s: float = _setting(10.0, _OTLP + "TIMEOUT", read=(_OTLP + "TRACES_TIMEOUT",), **_seconds(3.0))
    """One OTLP export call's deadline, retries included (``configure(export_timeout_s=)`` sets it too)."""
    # metrics table and budget
    max_steps: int = _setting(16, _AL + "MAX_STEPS", **_int(8, 1))
    max_samples_per_step: int = _setting(1 << 20, _AL + "MAX_RECORDED_SAMPLES_PER_STEP", **_int(1000, 1))
    max_exported_samples_per_step: int | None = _setting(
        None, _AL + "MAX_SAMPLES_PER_STEP", unset="no limit", **_budget(4)
    )
    keep_slowest: int = _setting(5, _AL + "KEEP_SLOWEST", **_int(2))
    keep_errors: bool = _setting(True, _AL + "KEEP_ERRORS", **_bool(False))
    max_buffered_spans: int = _setting(50_000, _AL + "MAX_BUFFERED_SPANS", **_int(1000))
    max_buffered_bytes: int = _setting(64 << 20, _AL + "MAX_BUFFERED_BYTES", **_int(1 << 20))
    # content
    capture_content: bool = _setting(False, _AL + "CAPTURE_CONTENT", **_bool(True))
    max_content_chars: int = _setting(2048, _AL + "MAX_CONTENT_CHARS", **_int(100, 1))
    # live view and watchdog (``configure(watchdog=WatchdogSettings(...))`` sets the watchdog_* fields)
    max_inflight_samples: int = _setting(65_536, _AL + "MAX_INFLIGHT_SAMPLES", **_int(1000, 1))
    watchdog_enabled: bool = _setting(True, _AL + "WATCHDOG", **_bool(False))
    watchdog_interval_s: float = _setting(
        1.0, _AL + "WATCHDOG_INTERVAL", **_seconds(0.5, minimum=MIN_WATCHDOG_INTERVAL, maximum=MAX_SECONDS)
    )
    watchdog_thresholds_s: str | None = _setting(
        None, _AL + "WATCHDOG_THRESHOLDS", unset="learned thresholds only", **_thresholds("tool:python=30.0")
    )
    watchdog_p99_multiple: float = _setting(3.0, _AL + "WATCHDOG_P99_MULTIPLE", **_seconds(4.0, maximum=1000.0))
    watchdog_min_s: float = _setting(10.0, _AL + "WATCHDOG_MIN", **_seconds(5.0, maximum=MAX_WATCHDOG_SECONDS))
    watchdog_default_s: float = _setting(
        300.0, _AL + "WATCHDOG_DEFAULT", **_seconds(60.0, maximum=MAX_WATCHDOG_SECONDS)
    )
    watchdog_min_observations: int = _setting(20, _AL + "WATCHDOG_MIN_OBSERVATIONS", **_int(10, 1, 1 << 20))
    watchdog_window: int = _setting(2048, _AL + "WATCHDOG_WINDOW", **_int(512, 1, 1 << 20))
    watchdog_max_warnings_per_check: int = _setting(20, _AL + "WATCHDOG_MAX_WARNINGS", **_int(5, 1, 10_000))
    # the library's own metrics (metrics._otel)
    metric_export_interval_s: float = _setting(
        60.0, "OTEL_METRIC_EXPORT_INTERVAL", **_seconds(5.0, millis=True, minimum=0.1)
    )
    metric_export_timeout_s: float = _setting(30.0, "OTEL_METRIC_EXPORT_TIMEOUT", **_seconds(5.0, millis=True))

    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def worker_env(self) -> dict[str, str]:
        """Variables that make :func:`resolve` in another process give these settings: every setting that is
        not the default or was set explicitly, under the variable it was read from (else its ``env``)."""
        env: dict[str, str] = {}
        for name, spec, default in SPECS:
            value = getattr(self, name)
            source = self.sources.get(name)
            if source is None and value == default:
                continue
            env[source if source in spec.read else spec.env] = "" if value is None else spec.show(value)
        return env


SPECS: tuple[tuple[str, Spec, Any], ...] = tuple(
    (f.name, f.metadata["spec"], f.default) for f in dataclasses.fields(Settings) if "spec" in f.metadata
)
"""Every setting: (field name, :class:`Spec`, default), in declaration order."""


def resolve(
    arguments: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    only: Collection[str] | None = None,
) -> Settings:
    """Settings from ``arguments`` (field name -> value; ``None`` means not given), else the environment,
    else the defaults (``only``: these fields; the others keep their defaults). A bad argument raises
    ``ValueError`` naming it; a bad variable warns, naming it, and the next variable (or the default) is used."""
    arguments = arguments or {}
    unknown = set(arguments) - {name for name, _, _ in SPECS}
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, spec, default in SPECS:
        if only is not None and name not in only:
            continue
        given = arguments.get(name)
        if given is not None:
            values[name], sources[name] = spec.check(name, given), "argument"
            if not spec.merge:
                continue
        for var in (*spec.read, spec.env):
            raw = env_str(var, environ)
            if raw is None:
                continue
            try:
                value = spec.parse(raw)
            except AdjustedError as exc:
                value = exc.value
                logger.warning("otel_agentloop: %s=%r %s; using %s", var, raw, exc, spec.describe(value))
            except ValueError as exc:
                chain = (*spec.read, spec.env)
                later = [v for v in chain[chain.index(var) + 1 :] if env_str(v, environ) is not None]
                used = later[0] if later else spec.describe(default)
                logger.warning("otel_agentloop: %s=%r %s; using %s", var, raw, exc, used)
                continue
            if name in values:  # merged: the arguments win
                values[name] = {**(value or {}), **values[name]}
            else:
                values[name], sources[name] = value, var
            break
    return Settings(**values, sources=sources)


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message % args`` as a warning once per ``key`` in this process (see :func:`forget_warnings`)."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


def forget_warnings() -> None:
    """Warn again about what :func:`warn_once` already reported (``testing.isolated`` calls it)."""
    with _warned_lock:
        _warned.clear()
