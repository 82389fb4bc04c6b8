"""HTTP calls bounded as a whole, for the readers of Jaeger (``_jaeger``) and its OpenSearch store (``_opensearch``).

Each call (:func:`fetch_json`) is bounded as a whole: connecting, sending, the answer's headers and its body, and
any redirects, together within the call's timeout, whatever the server drips (:class:`_DeadlineSocket`); a redirect
is followed only to an http(s) URL (:class:`_HttpOnlyRedirects`).
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer


class JaegerError(RuntimeError):
    """Jaeger could not be asked (unreachable, timed out) or answered with something other than a trace
    search result: an HTTP error other than 'not found', an empty or cut answer, or a body that is not JSON."""


class JaegerUnreachableError(JaegerError):
    """Nothing answered at the URL: refused, unknown host, or timed out while connecting."""


def fetch_json(
    request: urllib.request.Request | str,
    what: str,
    base_url: str,
    timeout_s: float,
    *,
    hint: str = "",
    absent_ok: bool = True,
) -> dict[str, object] | None:
    """The JSON object that one call, bounded as a whole (:func:`_opener`), answers ``request`` with; ``None`` for
    'not found' (404) when ``absent_ok``. ``what`` (``"GET <url>"``) and ``hint`` (a guess at what is wrong) go in
    the errors. Raises :class:`JaegerUnreachableError` when nothing answers at ``base_url``, else
    :class:`JaegerError`."""
    try:
        with _opener(time.monotonic() + timeout_s).open(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and absent_ok:
            return None
        try:
            detail = exc.read()[:300]
        except (OSError, http.client.HTTPException):
            detail = b""
        raise JaegerError(f"{what}: HTTP {exc.code} {exc.reason}: {detail!r}") from None
    except urllib.error.URLError as exc:  # refused, unknown host, timed out while connecting
        raise JaegerUnreachableError(f"{base_url}: {exc.reason}") from None
    except TimeoutError:  # the answer's headers or body did not all come within the call's deadline
        raise JaegerError(f"{what}: no complete answer within {timeout_s:g} s (--timeout)") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:  # reset, timed out, no or bad answer
        raise JaegerError(f"{what}: {type(exc).__name__}: {exc}") from None
    if not body.strip():
        raise JaegerError(f"{what}: an empty answer{hint}")
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise JaegerError(f"{what}: the answer is not JSON{hint}") from None
    if not isinstance(answer, dict):
        raise JaegerError(f"{what}: the answer is not a JSON object")
    return answer


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side that gives each read only what is left until ``deadline`` (``time.monotonic()``),
    raising :class:`TimeoutError` past it: a server dripping one byte at a time cannot stretch the call."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock, self._deadline = sock, deadline
        self._raw = sock.makefile("rb", buffering=0)  # the socket stays open while this reads (as makefile's)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        self._sock.settimeout(_left(self._deadline))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose reads and sends share one deadline (everything else is the socket's)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def sendall(self, data: ReadableBuffer, *args: int) -> None:
        self._sock.settimeout(_left(self._deadline))
        self._sock.sendall(data, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _bounded(base: type[http.client.HTTPConnection], deadline: float) -> Callable[..., http.client.HTTPConnection]:
    """``base`` (an HTTP or HTTPS connection class) connecting within what is left until ``deadline`` and then
    reading and sending within it (:class:`_DeadlineSocket`)."""

    class Bounded(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            self.timeout = _left(deadline)
            super().connect()
            # its socket (plain or TLS) wrapped: http.client reads and sends through any object with the
            # socket's methods, which its annotation (a socket) does not say
            this: Any = self
            this.sock = _DeadlineSocket(this.sock, deadline)

    return Bounded


class _BoundedHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """Plain HTTP and HTTPS (the default TLS checks), each connection bounded by the call's deadline; one object
    for both, so that ``build_opener`` adds neither default handler."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_bounded(http.client.HTTPConnection, self._deadline), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_bounded(http.client.HTTPSConnection, self._deadline), req)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are followed to http(s) URLs only (urllib's own also follows ``ftp://``)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            fp.close()
            raise JaegerError(
                f"GET {req.full_url}: redirected to {newurl!r}, which is not an http(s) URL; not followed"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener(deadline: float) -> urllib.request.OpenerDirector:
    """An opener for one call: every connection (redirects included) within ``deadline``, redirects to http(s)
    only; proxies as urllib reads them from the environment."""
    return urllib.request.build_opener(_BoundedHandler(deadline), _HttpOnlyRedirects())
