"""The OpenTelemetry SDK's own environment variables that are not :class:`~.Settings` fields, declared once
with how to check each (:data:`SDK_VARIABLES`: a parser and the default the SDK uses), and those handed to other
processes as they are (:data:`WORKER_VARIABLES`). ``_environment`` checks them with the rest.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from importlib import metadata

from ._settings import PROTOCOLS, SPECS
from ._values import (
    AdjustedError,
    env_str,
    number_text,
    parse_endpoint,
    positive_number,
    split_pairs,
)

Parse = Callable[[str], str]
"""Environment text -> the text the SDK may read (``ValueError`` with the reason, :class:`AdjustedError` with the
text used instead)."""


@dataclasses.dataclass(frozen=True)
class SdkVariable:
    """A variable that is not a setting (the SDK's, or ours): how to check it and what is used when it is unset."""

    name: str
    parse: Parse
    default: str
    fallback: str | None = None
    """The more general variable the SDK reads when this one is unset (``..._TRACES_X`` -> ``..._X``)."""


def _count(minimum: int = 0) -> Parse:
    def parse(raw: str) -> str:
        text = raw.strip()
        try:
            value = int(text)  # as the SDK parses: no floats, no exponents
        except ValueError:
            raise ValueError("is not an integer") from None
        if value < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return text

    return parse


def _duration(unit: str, maximum: float) -> Parse:
    """A positive finite number of ``unit`` (``"ms"`` or ``"s"``), at most ``maximum``: the range rule of every
    duration (``_values.positive_number``), the text kept as it is."""

    def parse(raw: str) -> str:
        try:
            positive_number(raw, maximum=maximum, unit=f" {unit}")
        except AdjustedError as exc:
            raise AdjustedError(str(exc), number_text(exc.value)) from None
        return raw

    return parse


def _url(raw: str) -> str:
    return parse_endpoint(raw)


def _headers(raw: str) -> str:
    _, malformed = split_pairs(raw)
    if malformed:
        kept = ",".join(item for item in raw.split(",") if item.strip() and item.strip() not in malformed)
        raise AdjustedError(f"has items that are not key=value: {', '.join(map(repr, malformed))}", kept or None)
    return raw


def _choice(*choices: str) -> Parse:
    def parse(raw: str) -> str:
        if raw.strip().lower() not in choices:
            raise ValueError(f"is not one of {', '.join(choices)}")
        return raw

    return parse


def _boolean(raw: str) -> str:
    if raw.strip().lower() not in ("true", "false"):
        raise ValueError("is not true or false")
    return raw


def _readable_file(raw: str) -> str:
    if not os.path.isfile(raw) or not os.access(raw, os.R_OK):
        raise ValueError("is not a readable file")
    return raw


def _anything(raw: str) -> str:
    return raw


def _entry_point_names(group: str) -> set[str]:
    try:
        return {ep.name for ep in metadata.entry_points(group=group)}
    except Exception:  # a broken distribution must not stop the check
        return set()


def _plugins(group: str, *builtin: str, many: bool = False) -> Parse:
    """A name registered in entry-point ``group`` (or a ``builtin`` one); ``many``: a comma-separated list whose
    unknown names are dropped."""

    def parse(raw: str) -> str:
        known = _entry_point_names(group) | set(builtin)
        names = [n.strip() for n in raw.split(",") if n.strip()] if many else [raw.strip()]
        unknown = [n for n in names if n not in known]
        if not unknown:
            return raw
        listed = ", ".join(map(repr, unknown))
        hint = f"names {listed}, not registered (entry points {group})"
        kept = [n for n in names if n not in unknown]
        if many and kept:
            raise AdjustedError(hint, ",".join(kept))
        raise ValueError(f"{hint}")

    return parse


_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
_BUILTIN_SAMPLERS = (
    "always_on",
    "always_off",
    "parentbased_always_on",
    "parentbased_always_off",
    *_RATIO_SAMPLERS,
)


def _number_in(read: Callable[[str], float], low: float, high: float, what: str) -> Parse:
    """A number ``read`` takes (``float``, ``int``) in ``[low, high]``, the text kept as it is; else "is not
    ``what``"."""

    def parse(raw: str) -> str:
        try:
            value = read(raw)
        except ValueError:
            raise ValueError(f"is not {what}") from None
        if not low <= value <= high:
            raise ValueError(f"is not {what}")
        return raw

    return parse


_ratio = _number_in(float, 0.0, 1.0, "a number in [0, 1]")
_port = _number_in(int, 0, 65535, "a port number (0-65535)")


def _sampler_arg(raw: str) -> str:
    sampler = (env_str("OTEL_TRACES_SAMPLER") or "").lower()
    if sampler and sampler not in _BUILTIN_SAMPLERS:
        return raw  # a plugin's argument: its own format
    return _ratio(raw)


def _grpc_status_codes(raw: str) -> str:
    names = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS"}
    names |= {"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE"}
    names |= {"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
    unknown = [c.strip() for c in raw.split(",") if c.strip() and c.strip().upper() not in names]
    if unknown:
        raise ValueError(f"has unknown gRPC status codes {', '.join(map(repr, unknown))}")
    return raw


_OTLP = "OTEL_EXPORTER_OTLP_"
_SIGNALS = ("TRACES_", "METRICS_", "LOGS_")
_MAX_S = 3600.0


def _otlp_variables() -> Iterable[SdkVariable]:
    """The OTLP exporters' variables: generic ones and their per-signal forms (``Settings`` declares the
    generic and traces endpoint, headers, protocol and timeout)."""
    declared = {var for _, spec, _ in SPECS for var in (spec.env, *spec.read)}
    kinds: dict[str, tuple[Parse, str]] = {
        "ENDPOINT": (_url, "the SDK's default endpoint"),
        "HEADERS": (_headers, "no headers"),
        "PROTOCOL": (_choice(*PROTOCOLS), "grpc"),
        "TIMEOUT": (_duration("s", _MAX_S), "10 s"),
        "COMPRESSION": (_choice("gzip", "deflate", "none"), "no compression"),
        "INSECURE": (_boolean, "false"),
        "CERTIFICATE": (_readable_file, "the system's root certificates"),
        "CLIENT_KEY": (_readable_file, "no client key"),
        "CLIENT_CERTIFICATE": (_readable_file, "no client certificate"),
    }
    for key, (parse, default) in kinds.items():
        for signal in ("", *_SIGNALS):
            name = _OTLP + signal + key
            if name not in declared:
                yield SdkVariable(name, parse, default, fallback=_OTLP + key if signal else None)
    yield SdkVariable(
        _OTLP + "METRICS_TEMPORALITY_PREFERENCE", _choice("cumulative", "delta", "lowmemory"), "cumulative"
    )
    yield SdkVariable(
        _OTLP + "METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
        _choice("explicit_bucket_histogram", "base2_exponential_bucket_histogram"),
        "explicit_bucket_histogram",
    )
    credentials = _plugins("opentelemetry_otlp_credential_provider")
    for transport in ("GRPC", "HTTP"):
        for signal in ("", *_SIGNALS):
            name = f"OTEL_PYTHON_EXPORTER_OTLP_{transport}_{signal}CREDENTIAL_PROVIDER"
            yield SdkVariable(name, credentials, "the exporter's own TLS credentials")
    yield SdkVariable(
        "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES", _grpc_status_codes, "the exporter's own list"
    )


def _limit_variables() -> Iterable[SdkVariable]:
    counts = ("SPAN_ATTRIBUTE", "SPAN_EVENT", "SPAN_LINK", "EVENT_ATTRIBUTE", "LINK_ATTRIBUTE", "LOGRECORD_ATTRIBUTE")
    yield SdkVariable("OTEL_ATTRIBUTE_COUNT_LIMIT", _count(), "128")
    for kind in counts:
        fallback = "OTEL_ATTRIBUTE_COUNT_LIMIT" if kind.endswith("ATTRIBUTE") else None
        yield SdkVariable(f"OTEL_{kind}_COUNT_LIMIT", _count(), "128", fallback=fallback)
    for kind in ("SPAN", "LOGRECORD"):
        yield SdkVariable(
            f"OTEL_{kind}_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            _count(),
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT's length",
            fallback="OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        )


def _other_variables() -> Iterable[SdkVariable]:
    yield SdkVariable(
        "OTEL_TRACES_SAMPLER", _plugins("opentelemetry_traces_sampler", *_BUILTIN_SAMPLERS), "parentbased_always_on"
    )
    yield SdkVariable("OTEL_TRACES_SAMPLER_ARG", _sampler_arg, "1.0")
    yield SdkVariable(
        "OTEL_PROPAGATORS", _plugins("opentelemetry_propagator", "none", many=True), "tracecontext,baggage"
    )
    yield SdkVariable("OTEL_PYTHON_CONTEXT", _plugins("opentelemetry_context"), "contextvars_context")
    yield SdkVariable("OTEL_PYTHON_ID_GENERATOR", _plugins("opentelemetry_id_generator"), "random")
    yield SdkVariable("OTEL_PYTHON_TRACER_PROVIDER", _plugins("opentelemetry_tracer_provider"), "the API's default")
    yield SdkVariable("OTEL_PYTHON_METER_PROVIDER", _plugins("opentelemetry_meter_provider"), "the API's default")
    yield SdkVariable("OTEL_PYTHON_LOGGER_PROVIDER", _plugins("opentelemetry_logger_provider"), "the API's default")
    yield SdkVariable("OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED", _boolean, "false")
    yield SdkVariable(
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS",
        _plugins("opentelemetry_resource_detector", many=True),
        "the default resource detectors",
    )
    yield SdkVariable(
        "OTEL_METRICS_EXPORTER", _plugins("opentelemetry_metrics_exporter", "none", many=True), "see metrics._otel"
    )
    yield SdkVariable("OTEL_LOGS_EXPORTER", _plugins("opentelemetry_logs_exporter", "none", many=True), "otlp")
    yield SdkVariable("OTEL_METRICS_EXEMPLAR_FILTER", _choice("trace_based", "always_on", "always_off"), "trace_based")
    yield SdkVariable("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", _boolean, "false")
    yield SdkVariable("OTEL_BLRP_MAX_QUEUE_SIZE", _count(1), "2048")
    yield SdkVariable("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", _count(1), "512")
    yield SdkVariable("OTEL_BLRP_SCHEDULE_DELAY", _duration("ms", _MAX_S * 1000), "5000 ms")
    yield SdkVariable("OTEL_BLRP_EXPORT_TIMEOUT", _duration("ms", _MAX_S * 1000), "30000 ms")
    yield SdkVariable("OTEL_EXPORTER_ZIPKIN_ENDPOINT", _url, "the SDK's default endpoint")
    yield SdkVariable("OTEL_EXPORTER_ZIPKIN_TIMEOUT", _duration("s", _MAX_S), "10 s")
    yield SdkVariable("OTEL_EXPORTER_PROMETHEUS_PORT", _port, "9464")
    yield SdkVariable(
        "OTEL_LOG_LEVEL", _choice("debug", "info", "warn", "warning", "error", "fatal", "critical"), "info"
    )
    # text the SDK takes as it is (names, paths, importable references): never invalid, never rewritten
    for name in (
        "OTEL_CONFIG_FILE",
        "OTEL_EXPORTER_PROMETHEUS_HOST",
        "OTEL_PYTHON_TRACER_CONFIGURATOR",
        "OTEL_PYTHON_METER_CONFIGURATOR",
        "OTEL_PYTHON_LOGGER_CONFIGURATOR",
    ):
        yield SdkVariable(name, _anything, "unset")


SDK_VARIABLES: tuple[SdkVariable, ...] = (*_limit_variables(), *_otlp_variables(), *_other_variables())
"""Every variable the SDK (API, SDK, OTLP exporters) reads that is not a :class:`~.Settings` field."""

WORKER_VARIABLES: tuple[str, ...] = (
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
    *(  # read by the exporters themselves (TLS, compression): a worker connects as this process does
        f"{_OTLP}{signal}{name}"
        for signal in ("", "TRACES_")
        for name in ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE", "COMPRESSION", "INSECURE")
    ),
    # the library's metrics (metrics._otel): a worker exports them as this process does
    "OTEL_METRICS_EXPORTER",
    "OTEL_METRICS_EXEMPLAR_FILTER",
    _OTLP + "METRICS_ENDPOINT",
    _OTLP + "METRICS_PROTOCOL",
    _OTLP + "METRICS_HEADERS",
)
"""Of :data:`SDK_VARIABLES`, those handed to other processes (Ray workers) as they are (:func:`handed_over`), so
that they sample, limit and connect as this one; ``Settings.worker_env`` hands over the settings."""
