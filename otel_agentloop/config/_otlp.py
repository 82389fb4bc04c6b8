"""Where and how each signal's OTLP exporter connects, resolved once: :class:`OtlpTarget`, from :func:`resolve_otlp`.

The one place the library reads the ``OTEL_EXPORTER_OTLP_*`` variables that configure an exporter (``Settings``
declares and checks the traces' endpoint, protocol, headers and timeout; ``_environment`` checks every one).
Each value is the ``configure()`` argument, else the signal's variable (``OTEL_EXPORTER_OTLP_TRACES_X``,
``..._METRICS_X``), else the generic one (``OTEL_EXPORTER_OTLP_X``), as the OTel specification says; headers
are the variables' updated with the argument's (:attr:`OtlpTarget.all_headers`, on every protocol).

The rules that turn a target into a connection are written here once, as the target's properties: the URL per
signal (:attr:`~OtlpTarget.url`; gRPC: :attr:`~OtlpTarget.grpc_address`), the headers each transport can carry
(:attr:`~OtlpTarget.http_headers`, :attr:`~OtlpTarget.grpc_metadata`), TLS (:attr:`~OtlpTarget.http_verify`,
:attr:`~OtlpTarget.http_cert`, :attr:`~OtlpTarget.grpc_tls_files`), the compression
(:meth:`~OtlpTarget.compression_for`, :attr:`~OtlpTarget.grpc_compression`) and one call's deadline
(:meth:`~OtlpTarget.timeout_for`). Every exporter is built from its target alone: the trace exporters
(``export._grpc``, ``export._http_json``, ``export._http_proto``), the metric exporter (``metrics._otel``); the
engine's hand-over (``integrations.vllm``) and the workers' (``setup``'s ``worker_env``) read it too.
:func:`otlp_settings` makes both signals' targets of one ``configure()``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import ParseResult, urlparse

from . import _headers
from ._environment import variable
from ._settings import Settings
from ._values import parse_headers, warn_once

Signal = Literal["TRACES", "METRICS"]
TlsFiles = tuple[str | None, str | None, str | None]
"""(CA certificate, client key, client certificate) file paths, each possibly ``None``."""

_OTLP = "OTEL_EXPORTER_OTLP_"
_TLS_KEYS = ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE")
_DEFAULT_HTTP = "http://localhost:4318"
_DEFAULT_GRPC = "http://localhost:4317"
COMPRESSIONS = ("gzip", "deflate", "none")
DEFAULT_COMPRESSION = {"http/json": "gzip"}
"""A protocol's compression when neither the argument nor the variables say: gzip for http/json (JSON shrinks
~10x), none for every other (as the SDK's exporters)."""
DEFAULT_TIMEOUT_S = 10.0
"""One export call's deadline when none is set (the SDK's)."""


def _lower(compression: str) -> str:
    """An argument's compression name lowercased; anything else (a ``grpc.Compression``) as given."""
    return compression.lower() if isinstance(compression, str) else compression


@dataclasses.dataclass(frozen=True)
class OtlpTarget:
    """One signal's OTLP export settings, resolved (see :func:`resolve_otlp`), and the rules that turn them into
    a connection (see the module docstring): what every exporter is built from."""

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
    """One export call's deadline (``None``: :data:`DEFAULT_TIMEOUT_S`); checked by :meth:`timeout_for`."""
    compression: str | None = None
    """As the variables (or an argument) say, lowercased (``gzip``, ``deflate``, ``none``); ``None``: unset."""
    insecure: bool | None = None
    """``..._INSECURE`` (``True`` only for ``true``); ``None``: unset."""
    tls: TlsFiles = (None, None, None)
    """TLS files as an HTTP exporter reads them: each the signal's variable, else the generic one."""
    grpc_tls: TlsFiles = (None, None, None)
    """TLS files as the SDK's gRPC exporter reads them: the signal's three when its ``CERTIFICATE`` is set, else
    the generic three."""

    def given(
        self,
        endpoint: str | None = None,
        headers: Mapping[str, object] | None = None,
        *,
        timeout_s: float | None = None,
        compression: str | None = None,
        tls: TlsFiles = (None, None, None),
    ) -> OtlpTarget:
        """This target with an exporter's own arguments (each ``None``: this target's): an ``endpoint`` is an
        argument's (:attr:`url` appends the signal's path when it lacks it); ``headers`` replace
        :attr:`given_headers`; each TLS file given replaces the HTTP one (:attr:`tls`)."""
        if endpoint is None and headers is None and timeout_s is None and compression is None and not any(tls):
            return self
        mine, theirs = tls, self.tls
        return dataclasses.replace(
            self,
            endpoint=self.endpoint if endpoint is None else endpoint,
            source=self.source if endpoint is None else "argument",
            given_headers=self.given_headers if headers is None else headers,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            compression=self.compression if compression is None else _lower(compression),
            tls=(mine[0] or theirs[0], mine[1] or theirs[1], mine[2] or theirs[2]),
        )

    # -- where ----------------------------------------------------------------------------------------------------
    @property
    def given_endpoint(self) -> str | None:
        """The endpoint when it was given as an argument (exporters read the variables' as the SDK does)."""
        return self.endpoint if self.source == "argument" else None

    @property
    def url(self) -> str:
        """The HTTP URL, as the SDK's OTLP/HTTP exporter makes it: an argument gets the signal's path
        (``/v1/traces``, ``/v1/metrics``) appended when it lacks it; the signal's variable is used as it is; the
        generic one (or ``http://localhost:4318``) gets the path appended."""
        path = "/v1/" + self.signal.lower()
        if self.source == "argument" and self.endpoint is not None:
            return self.endpoint if self.endpoint.rstrip("/").endswith(path) else self.endpoint.rstrip("/") + path
        if self.source == _OTLP + self.signal + "_ENDPOINT" and self.endpoint is not None:
            return self.endpoint
        return (self.endpoint or _DEFAULT_HTTP).rstrip("/") + path

    def _grpc_url(self) -> ParseResult:
        try:
            return urlparse(self.endpoint or _DEFAULT_GRPC)
        except ValueError:  # "http://[::1": gRPC is handed the text as it is, and fails to connect (counted)
            return urlparse("")

    @property
    def grpc_address(self) -> str:
        """Where a gRPC channel connects (``host:port``), as the SDK's gRPC exporter reads the endpoint (the
        text as it is when it has no scheme; ``http://localhost:4317`` when none is set)."""
        return self._grpc_url().netloc or self.endpoint or _DEFAULT_GRPC

    @property
    def grpc_insecure(self) -> bool:
        """A plain gRPC connection: ``http://`` is plain and ``https://`` TLS; without a scheme, TLS unless
        :attr:`insecure` says ``true`` (as the SDK's gRPC exporter)."""
        scheme = self._grpc_url().scheme
        if scheme in ("https", "http") or self.insecure is None:
            return scheme == "http"
        return self.insecure

    # -- what is sent ---------------------------------------------------------------------------------------------
    @property
    def all_headers(self) -> dict[str, object]:
        """What every exporter sends (the SDK 1.45's OTLP/HTTP rule, applied to every protocol): :attr:`headers`
        updated item by item with :attr:`given_headers` (names lowercased; the argument wins a name both give).
        Unchecked: :attr:`http_headers` and :attr:`grpc_metadata` are what each transport can carry."""
        return merge_headers(self.headers, self.given_headers)

    @property
    def http_headers(self) -> dict[str, str]:
        """:attr:`all_headers` an HTTP request can carry; each item it cannot is skipped with a warning naming it
        (``config._headers``)."""
        return _headers.http_headers(self.all_headers)

    @property
    def grpc_metadata(self) -> _headers.GrpcMetadata:
        """:attr:`all_headers` as gRPC metadata; each item gRPC cannot carry is skipped with a warning naming it
        (``config._headers``)."""
        return _headers.grpc_metadata(self.all_headers)

    def compression_for(self, protocol: str) -> str:
        """``gzip``, ``deflate`` or ``none``: :attr:`compression`, else ``protocol``'s default
        (:data:`DEFAULT_COMPRESSION`); a name that is none of them is warned once and the default used."""
        default = DEFAULT_COMPRESSION.get(protocol, "none")
        chosen = self.compression or default
        if chosen not in COMPRESSIONS:
            warn_once(
                f"{protocol}-compression",
                "otel_agentloop: OTLP compression %r is not one of %s; using %s",
                chosen,
                ", ".join(COMPRESSIONS),
                default,
            )
            return default
        return chosen

    @property
    def grpc_compression(self) -> Any:  # Any: grpc is untyped (its Compression too)
        """:meth:`compression_for` gRPC as a ``grpc.Compression``, passed explicitly (the SDK's gRPC exporters
        raise on ``deflate`` and ``none`` read from the variables)."""
        from grpc import Compression  # type: ignore[import-untyped]

        names = {"gzip": Compression.Gzip, "deflate": Compression.Deflate}
        return names.get(self.compression_for("grpc"), Compression.NoCompression)

    def timeout_for(self, protocol: str) -> float:
        """One export call's deadline in seconds: :attr:`timeout_s`, else :data:`DEFAULT_TIMEOUT_S`; a value
        that is not a positive finite number of seconds is warned once (naming ``protocol``) and the default
        used."""
        value: object = self.timeout_s
        if value is None:
            return DEFAULT_TIMEOUT_S
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            warn_once(
                f"{protocol}-timeout",
                "otel_agentloop: OTLP %s timeout %r is not a positive finite number of seconds; using %g",
                protocol,
                value,
                DEFAULT_TIMEOUT_S,
            )
            return DEFAULT_TIMEOUT_S
        return float(value)

    # -- TLS ------------------------------------------------------------------------------------------------------
    @property
    def http_verify(self) -> bool | str:
        """What verifies an HTTPS server: the CA file of :attr:`tls`, else the system's (``True``)."""
        return self.tls[0] or True

    @property
    def http_cert(self) -> str | tuple[str, str] | None:
        """The client certificate an HTTP exporter presents: (certificate, key) when both are set, else the
        certificate file alone (it holds its key), else none."""
        _, key, certificate = self.tls
        return (certificate, key) if certificate and key else certificate

    @property
    def grpc_tls_files(self) -> TlsFiles | None:
        """The TLS files of a gRPC connection (:attr:`grpc_tls`); ``None`` for a plain one (:attr:`grpc_insecure`)."""
        return None if self.grpc_insecure else self.grpc_tls


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
