"""OTLP/HTTP with a JSON body (``http/json``), using the cheap string encoder instead of protobuf.

Settings read off its resolved target (``config._otlp.OtlpTarget``, where the rules are written), as the OTel
OTLP/HTTP exporter reads them (the ``_TRACES_`` variable first, then the generic one; an argument wins over
both):

- ``OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE``: CA bundle that verifies the server (else the system's);
  ``_CLIENT_CERTIFICATE`` and ``_CLIENT_KEY``: the client's certificate and key for mutual TLS.
- ``OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION``: ``gzip`` (our default when unset: JSON shrinks ~10x),
  ``deflate`` or ``none``.
- ``OTEL_EXPORTER_OTLP[_TRACES]_INSECURE`` does not apply: as for the OTel HTTP exporter, the endpoint's
  scheme decides (``https://`` is TLS, ``http://`` is plain).

The session is hardened against a hostile or misconfigured endpoint: redirects are never followed (a 3xx is a
failed export, warned once with its ``Location``: following one would re-send credential headers to another
origin, or turn the POST into a GET that "succeeds" without delivering anything); at most
``MAX_ANSWER_BYTES`` of an answer are read, undecoded, within the export's deadline (a longer answer closes
its connection); ``Retry-After`` is bounded (see :func:`retry_after_s`); a header that HTTP cannot carry (a
control character such as CR/LF in its value, a name that is not a token, a value outside Latin-1) is
skipped with a warning naming it (``OtlpTarget.http_headers``).
"""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import math
import random
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace.export import SpanExportResult

from ..config._otlp import OtlpTarget, resolve_otlp
from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ._otlp_json import encode_request
from ._sending import SendingExporter

if TYPE_CHECKING:  # requests is imported on the first export: configure() does not pay for it
    from requests import Response, Session

_RETRYABLE = frozenset({429, 502, 503, 504})
MAX_ANSWER_BYTES = 64 << 10
"""At most this much of an answer is read (OTLP answers are a few bytes; the rest is never downloaded)."""
MAX_RETRY_AFTER_S = 3600.0
"""A longer ``Retry-After`` is read as this (past any export deadline: the export fails at once)."""
MIN_RETRY_WAIT_S = 0.1
"""A ``Retry-After`` shorter than this (``0``) waits this long: a server saying "now" again and again is not
hammered."""


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP date), in
    ``[0, MAX_RETRY_AFTER_S]``; ``None`` if absent or unreadable (not a number, NaN, infinite, negative, or a
    date that does not parse): the caller then backs off as without the header. A date in the past is 0."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
            seconds = max(when.timestamp() - (time.time() if now is None else now), 0.0)
        except Exception:  # TypeError, ValueError, IndexError, OverflowError... from garbage dates
            return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


class OTLPJsonHttpExporter(SendingExporter):
    """POST ``{"resourceSpans": ...}`` to the target's URL (``.../v1/traces``) over one reused HTTP session.

    Contract: :meth:`export_records` never raises, and starts no try and no wait past ``timeout_s`` from its start
    (each try's connect and each read get the time left; a server that trickles bytes can stretch the last
    try, which is why the export processor never waits on the network). A retryable answer (429/502/503/504)
    is retried after its ``Retry-After`` when it gives one, else after a jittered back-off (0.25 s doubling
    to 2 s); a dropped pooled connection is retried at once, other connection errors after the back-off.
    When the next try would start past the deadline, or on any other answer, the export reports FAILURE
    (counted by the export processor); the first failed try is warned at once, once
    (:meth:`SendingExporter._failed`). :meth:`shutdown` aborts a back-off wait. A forked child opens its own
    connections. A 3xx answer is a failure (not followed, not retried). Spans that cannot be encoded are left
    out and counted in ``spans_unencodable``.
    """

    protocol = "http/json"
    """The protocol's name, in warnings (a subclass sends another body: ``export._http_proto``)."""
    content_type = "application/json"

    def __init__(
        self,
        endpoint: str | OtlpTarget,
        headers: Mapping[str, object] | None = None,
        timeout_s: float | None = None,
        *,
        compression: str | None = None,
        certificate_file: str | None = None,
        client_key_file: str | None = None,
        client_certificate_file: str | None = None,
    ) -> None:
        """``endpoint``: a resolved target (``config._otlp.OtlpTarget``, what ``configure()`` passes), or a URL
        (``/v1/traces`` appended when it lacks it) over the environment's target. The other arguments, when
        given, replace the target's (``headers``: sent over the environment's, ``OtlpTarget.all_headers``;
        ``timeout_s`` default 10 s)."""
        base, url = (endpoint, None) if isinstance(endpoint, OtlpTarget) else (resolve_otlp("TRACES"), endpoint)
        super().__init__(
            base.given(
                url,
                headers,
                timeout_s=timeout_s,
                compression=compression,
                tls=(certificate_file, client_key_file, client_certificate_file),
            )
        )
        target = self.target
        self.endpoint = target.url
        self.compression = target.compression_for(self.protocol)
        self.headers = {"Content-Type": self.content_type, **target.http_headers}
        if self.compression != "none":
            self.headers["Content-Encoding"] = self.compression
        self.verify = target.http_verify
        self.cert = target.http_cert

    def _forget_connection(self) -> None:
        self._session: Session | None = None  # a forked child's: the parent's pooled sockets are not its own

    def _get_session(self) -> Session:
        session = self._session
        if session is None:
            import requests  # first export, on the export thread: configure() does not pay for the import

            with self._lock:
                session = self._session
                if session is None:
                    session = self._session = requests.Session()
                    session.headers.update(self.headers)
        return session

    def _body(self, spans: Sequence[FastSpan]) -> bytes | None:
        """The compressed request; ``None`` when no span of the batch could be encoded."""
        data = self.encoded(spans, self._encode)
        if data is None:
            return None
        if self.compression == "gzip":
            return gzip.compress(data, compresslevel=1)
        if self.compression == "deflate":
            return zlib.compress(data, 1)
        return data

    def _encode(self, spans: Sequence[FastSpan]) -> tuple[bytes, int]:
        """The request body (uncompressed), and how many spans could not be encoded."""
        return encode_request(spans)

    def _answered(self, response: Response, body: bytes) -> None:
        """A 2xx answer arrived; ``body``: at most ``MAX_ANSWER_BYTES`` of it, as sent (not decoded)."""

    def _export(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        import requests

        deadline = time.monotonic() + self.timeout_s
        body = self._body(spans)
        if body is None:
            return SpanExportResult.SUCCESS  # nothing left to send (the spans are counted as unencodable)
        session = self._get_session()
        backoff = 0.25
        reconnected = False
        while True:
            remaining = deadline - time.monotonic()
            wait: float | None = None
            try:
                # verify and cert per request: on the session alone, REQUESTS_CA_BUNDLE would override them
                response = session.post(
                    self.endpoint,
                    data=body,
                    timeout=max(remaining, 0.01),
                    verify=self.verify,
                    cert=self.cert,
                    allow_redirects=False,
                    stream=True,
                )
                judged = self._judge(response, deadline)
                if isinstance(judged, SpanExportResult):
                    return judged
                retry, reason, wait = judged
            except requests.exceptions.SSLError as exc:
                retry, reason = False, f"TLS: {exc}"
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                retry, reason = True, str(exc)
                if not reconnected and isinstance(exc, requests.exceptions.ConnectionError):
                    reconnected = True  # the server closed an idle pooled connection: try a fresh one at once
                    wait = 0.0
            except requests.exceptions.RequestException as exc:
                retry, reason = False, str(exc)
            if wait is None:
                wait = backoff * random.uniform(0.8, 1.2)
                backoff = min(backoff * 2, 2.0)
            if wait > 0 or not retry:  # the free reconnect of a dropped pooled connection is no failure
                self._failed(reason)  # warned once, at the first failed try
            if not retry or self._shutdown or time.monotonic() + wait >= deadline:
                return SpanExportResult.FAILURE
            if wait > 0 and self._stop.wait(wait):
                return SpanExportResult.FAILURE

    def _judge(self, response: Response, deadline: float) -> SpanExportResult | tuple[bool, str, float | None]:
        """A 2xx answer is SUCCESS, a 3xx FAILURE (warned once, not followed); any other: (retry it?, the reason,
        the wait its ``Retry-After`` asks for: ``None`` when it asks none)."""
        answer = _discard_answer(response, deadline)
        status = response.status_code
        if 200 <= status < 300:
            self._succeeded()
            self._answered(response, answer)
            return SpanExportResult.SUCCESS
        if 300 <= status < 400:
            self.failing, self.failure = True, f"HTTP {status}, a redirect (not followed)"
            warn_once(
                f"{self.protocol}-redirect",
                "otel_agentloop: OTLP %s endpoint %s answered HTTP %d (Location: %r); redirects "
                "are not followed, so spans are counted as failed: set the endpoint to the final URL",
                self.protocol,
                self.endpoint,
                status,
                response.headers.get("Location"),
            )
            return SpanExportResult.FAILURE
        wait = None
        if status in _RETRYABLE:
            wait = retry_after_s(response.headers.get("Retry-After"))
            if wait is not None:
                wait = max(wait, MIN_RETRY_WAIT_S)
        return status in _RETRYABLE, f"HTTP {status}", wait

    @property
    def destination(self) -> str:
        return self.endpoint

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception:
                internal_error(f"{type(self).__name__}.shutdown")


def _discard_answer(response: Response, deadline: float) -> bytes:
    """Read the answer, at most ``MAX_ANSWER_BYTES`` of it, undecoded (no decompression bomb), and only until
    ``deadline``; what was read. An answer read to its end returns the connection to the pool; a longer,
    slower or broken one is cut, closing its connection (the status line already decided the result)."""
    raw = response.raw
    left = MAX_ANSWER_BYTES
    chunks: list[bytes] = []
    with contextlib.suppress(Exception), contextlib.closing(response):
        while left > 0 and time.monotonic() < deadline:
            chunk = raw.read(min(left, 16384), decode_content=False)
            if not chunk:
                break  # read to the end: urllib3 has put the connection back in the pool
            chunks.append(chunk)
            left -= len(chunk)
    return b"".join(chunks)
