"""Where and how each signal's OTLP exporter connects, resolved once: :class:`OtlpTarget`, from :func:`resolve_otlp`.

The one place the library reads the ``OTEL_EXPORTER_OTLP_*`` variables that configure an exporter (``Settings``
declares and checks the traces' endpoint, protocol, headers and timeout; ``_environment`` checks every one).
Each value is the ``configure()`` argument, else the signal's variable (``OTEL_EXPORTER_OTLP_TRACES_X``,
``..._METRICS_X``), else the generic one (``OTEL_EXPORTER_OTLP_X``), as the OTel specification says; headers
are the variables' updated with the argument's (:attr:`OtlpTarget.all_headers`, on every protocol). Every
exporter reads its target: the trace exporters (``export._grpc``, ``export._http_json``, ``export._http_proto``),
the metric exporter (``metrics._otel``), the engine's hand-over (``integrations.vllm``) and the workers'
(``setup``'s ``worker_env``). :func:`otlp_settings` makes both signals' targets of one ``configure()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Literal

from ._environment import variable
from ._settings import Settings
from ._values import parse_headers

Signal = Literal["TRACES", "METRICS"]
TlsFiles = tuple[str | None, str | None, str | None]
"""(CA certificate, client key, client certificate) file paths, each possibly ``None``."""

_OTLP = "OTEL_EXPORTER_OTLP_"
_TLS_KEYS = ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE")
_DEFAULT_HTTP = "http://localhost:4318"


@dataclasses.dataclass(frozen=True)
class OtlpTarget:
    """One signal's OTLP export settings, resolved (see :func:`resolve_otlp`); what every exporter reads."""

    signal: Signal
    endpoint: str | None = None
    """The argument, else the signal's variable, else the generic one; ``None``: none is set."""
    source: str | None = None
    """Where :attr:`endpoint` came from: ``"argument"`` or the variable's name."""
    protocol: str = "grpc"
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The environment's headers (the signal's variable replaces the generic one whole), names lowercased."""
    given_headers: Mapping[str, object] | None = None
    """Headers given as arguments (``configure(headers=)``, or an exporter's own); ``None``: none given. Sent
    over the environment's: :attr:`all_headers`."""
    timeout_s: float | None = None
    """One export call's deadline (``None``: the exporter's default)."""
    compression: str | None = None
    """As the variables say, lowercased (``gzip``, ``deflate``, ``none``); ``None``: unset."""
    insecure: bool | None = None
    """``..._INSECURE`` (``True`` only for ``true``); ``None``: unset."""
    tls: TlsFiles = (None, None, None)
    """TLS files as an HTTP exporter reads them: each the signal's variable, else the generic one."""
    grpc_tls: TlsFiles = (None, None, None)
    """TLS files as the SDK's gRPC exporter reads them: the signal's three when its ``CERTIFICATE`` is set, else
    the generic three."""

    @property
    def all_headers(self) -> dict[str, object]:
        """What every exporter sends (the SDK 1.45's OTLP/HTTP rule, applied to every protocol): :attr:`headers`
        updated item by item with :attr:`given_headers` (names lowercased; the argument wins a name both give).
        Unchecked: each exporter skips, with a warning, an item its transport cannot carry."""
        return merge_headers(self.headers, self.given_headers)

    @property
    def given_endpoint(self) -> str | None:
        """The endpoint when it was given as an argument (exporters read the variables' as the SDK does)."""
        return self.endpoint if self.source == "argument" else None

    @property
    def url(self) -> str:
        """The HTTP URL, as the SDK's OTLP/HTTP exporter makes it: an argument gets the signal's path
        (``/v1/traces``) appended when it lacks it; the signal's variable is used as it is; the generic one (or
        ``http://localhost:4318``) gets the path appended."""
        path = "/v1/" + self.signal.lower()
        if self.source == "argument" and self.endpoint is not None:
            return self.endpoint if self.endpoint.rstrip("/").endswith(path) else self.endpoint.rstrip("/") + path
        if self.source == _OTLP + self.signal + "_ENDPOINT" and self.endpoint is not None:
            return self.endpoint
        return (self.endpoint or _DEFAULT_HTTP).rstrip("/") + path


@dataclasses.dataclass(frozen=True)
class OtlpSettings:
    """Both signals' targets of one ``configure()`` (``handle.otlp``)."""

    traces: OtlpTarget
    metrics: OtlpTarget


def resolve_otlp(
    signal: Signal,
    endpoint: str | None = None,
    headers: Mapping[str, object] | None = None,
    *,
    protocol: str | None = None,
    timeout_s: float | None = None,
) -> OtlpTarget:
    """``signal``'s target: each argument given, else the signal's variable, else the generic one."""
    source = "argument" if endpoint is not None else None
    if endpoint is None:
        for var in (f"{_OTLP}{signal}_ENDPOINT", _OTLP + "ENDPOINT"):
            endpoint = variable(var)
            if endpoint is not None:
                source = var
                break
    raw_headers = otlp_variable(signal, "HEADERS")
    compression = otlp_variable(signal, "COMPRESSION")
    insecure = otlp_variable(signal, "INSECURE")
    grpc_kind = f"{signal}_" if variable(f"{_OTLP}{signal}_CERTIFICATE") else ""
    return OtlpTarget(
        signal=signal,
        endpoint=endpoint,
        source=source,
        protocol=(protocol or otlp_variable(signal, "PROTOCOL") or "grpc").lower(),
        headers=parse_headers(raw_headers, f"{_OTLP}[{signal}_]HEADERS") if raw_headers else {},
        given_headers=headers,
        timeout_s=timeout_s,
        compression=compression.lower() if compression is not None else None,
        insecure=insecure.lower() == "true" if insecure is not None else None,
        tls=_files(lambda key: otlp_variable(signal, key)),
        grpc_tls=_files(lambda key: variable(f"{_OTLP}{grpc_kind}{key}")),
    )


def otlp_settings(s: Settings) -> OtlpSettings:
    """The targets of a ``configure()`` that resolved ``s``. Traces: its endpoint, protocol and timeout, and the
    headers argument (:attr:`OtlpTarget.all_headers`: over the environment's). Metrics: the endpoint, headers
    and protocol arguments (the endpoint and headers ones not when ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is
    set: the metrics go elsewhere, with their variables' headers only), else the metric variables. The traces'
    endpoint is ``s.endpoint`` (read from the same variables)."""
    argument = s.endpoint if s.sources.get("endpoint") == "argument" else None
    headers = s.headers if s.sources.get("headers") == "argument" else None
    traces = resolve_otlp("TRACES", argument, headers, protocol=s.protocol, timeout_s=s.otlp_timeout_s)
    elsewhere = variable(_OTLP + "METRICS_ENDPOINT") is not None  # the arguments describe the traces' receiver
    protocol = s.protocol if s.sources.get("protocol") == "argument" else None
    metrics = resolve_otlp(
        "METRICS", None if elsewhere else argument, None if elsewhere else headers, protocol=protocol
    )
    return OtlpSettings(traces, metrics)


def merge_headers(environment: Mapping[str, object], given: Mapping[str, object] | None) -> dict[str, object]:
    """``environment``'s headers updated with ``given`` (its names lowercased), as :attr:`OtlpTarget.all_headers`."""
    merged = dict(environment)
    merged.update({k.lower() if isinstance(k, str) else k: v for k, v in (given or {}).items()})
    return merged


def otlp_variable(signal: str, key: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_{signal}_{key}``, else ``OTEL_EXPORTER_OTLP_{key}``, as the SDK's exporters read them
    (``signal``: ``"TRACES"``, ``"METRICS"``)."""
    return variable(f"{_OTLP}{signal}_{key}") or variable(_OTLP + key)


def _files(read: Callable[[str], str | None]) -> TlsFiles:
    certificate, key, chain = (read(name) for name in _TLS_KEYS)
    return certificate, key, chain
