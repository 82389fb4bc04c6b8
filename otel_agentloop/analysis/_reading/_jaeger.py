"""A small client for Jaeger's ``api_v3`` HTTP query API (stdlib only).

Answers are OTLP-JSON (``result.resourceSpans``, hex ids); :func:`otel_agentloop.decode_resource_spans`
turns them into :class:`~otel_agentloop.SpanRecord`. Built on ``/api/v3`` only: the legacy
``/api/traces?service=`` was removed on Jaeger's main branch. A missing trace or an empty search is a 404,
returned here as an empty list (poll past it while spans are in flight).

Each call is bounded as a whole (:class:`_Deadline`): connecting, sending, the answer's headers and its body, and
any redirects, together within the call's timeout, whatever the server drips; a redirect is followed only to
an http(s) URL (:class:`_HttpOnlyRedirects`), as the client's own URL check says.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

_UNIX = datetime(1970, 1, 1, tzinfo=timezone.utc)
MIN_WINDOW = timedelta(microseconds=1)
"""The narrowest time window :meth:`JaegerClient.find_all_traces` splits a full search into (the API takes
RFC 3339 times to the microsecond here)."""
MAX_SEARCHES = 4096
"""The most searches one :meth:`JaegerClient.find_all_traces` makes; past it, what is left is reported."""


Finder = Callable[..., list[dict[str, Any]]]
"""A search with :meth:`JaegerClient.find_traces`'s arguments and answer."""


class JaegerError(RuntimeError):
    """Jaeger could not be asked (unreachable, timed out) or answered with something other than a trace
    search result: an HTTP error other than 'not found', an empty or cut answer, or a body that is not JSON."""


class JaegerUnreachableError(JaegerError):
    """Nothing answered at the URL: refused, unknown host, or timed out while connecting."""


def _rfc3339(t: datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


TRACES_PER_TIMEOUT = 1000
"""A search for N traces is bounded by ``timeout_s`` x N / this (at least ``timeout_s``)."""


class JaegerClient:
    """``JaegerClient("http://127.0.0.1:16686")``; every call is bounded by ``timeout_s``."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
            raise JaegerError(f"{base_url!r} is not an http(s) URL")  # urllib would also open file:// and ftp://
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: Mapping[str, str] | None = None, *, timeout_s: float | None = None) -> Any | None:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        timeout_s = timeout_s or self.timeout_s
        try:
            with _opener(time.monotonic() + timeout_s).open(url, timeout=timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            try:
                detail = exc.read()[:300]
            except (OSError, http.client.HTTPException):
                detail = b""
            raise JaegerError(f"GET {url}: HTTP {exc.code} {exc.reason}: {detail!r}") from None
        except urllib.error.URLError as exc:  # refused, unknown host, timed out while connecting
            raise JaegerUnreachableError(f"{self.base_url}: {exc.reason}") from None
        except TimeoutError:  # the answer's headers or body did not all come within the call's deadline
            raise JaegerError(f"GET {url}: no complete answer within {timeout_s:g} s (--timeout)") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:  # reset, timed out, no or bad answer
            raise JaegerError(f"GET {url}: {type(exc).__name__}: {exc}") from None
        if not body.strip():
            raise JaegerError(f"GET {url}: an empty answer (is this Jaeger's query port?)")
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            raise JaegerError(f"GET {url}: the answer is not JSON (is this Jaeger's query port?)") from None
        if not isinstance(answer, dict):
            raise JaegerError(f"GET {url}: the answer is not a JSON object")
        return answer

    def services(self) -> list[str]:
        """Service names Jaeger has seen."""
        body = self._get("/api/v3/services") or {}
        services = body.get("services") or []
        if not isinstance(services, list):
            raise JaegerError("/api/v3/services: 'services' is not a list")
        return [str(s) for s in services]

    def operations(self, service: str) -> list[str]:
        """The span names (operations) Jaeger has seen for ``service``."""
        body = self._get("/api/v3/operations", {"service": service}) or {}
        ops = body.get("operations") or []
        if not isinstance(ops, list):
            raise JaegerError("/api/v3/operations: 'operations' is not a list")
        return [str(o.get("name")) for o in ops if isinstance(o, dict)]

    def find_traces(
        self,
        service: str,
        start: datetime,
        end: datetime,
        *,
        attributes: Mapping[str, str] | None = None,
        operation: str | None = None,
        search_depth: int = 500,
    ) -> list[dict[str, Any]]:
        """The ``resourceSpans`` of the traces of ``service`` in [start, end], at most ``search_depth`` (below
        Jaeger's max-traces setting). ``attributes`` (e.g. ``{"rl.step": "3"}``) narrows the search where Jaeger
        supports ``query.attributes`` (newer than 2.13); callers still filter the spans they get. A search for
        more than :data:`TRACES_PER_TIMEOUT` traces may take ``timeout_s`` per that many (Jaeger's OpenSearch
        reader fetches each trace with a search of its own: 8,192 traces took 10-13 s here)."""
        params = {
            "query.service_name": service,
            "query.start_time_min": _rfc3339(start),
            "query.start_time_max": _rfc3339(end),
            "query.search_depth": str(search_depth),  # the name since Jaeger 2.14 ...
            "query.num_traces": str(search_depth),  # ... and before (2.13 here); each ignores the other
        }
        if operation:
            params["query.operation_name"] = operation
        if attributes:
            params["query.attributes"] = json.dumps(dict(attributes))
        timeout_s = self.timeout_s * max(1.0, search_depth / TRACES_PER_TIMEOUT)
        return self._resource_spans(self._get("/api/v3/traces", params, timeout_s=timeout_s))

    def find_all_traces(
        self,
        service: str,
        start: datetime,
        end: datetime,
        *,
        attributes: Mapping[str, str] | None = None,
        operation: str | None = None,
        search_depth: int = 500,
        finder: Finder | None = None,
    ) -> Search:
        """Every trace :meth:`find_traces` would match in [start, end], not just one page of ``search_depth``.

        ``api_v3`` has no cursor: a search that returns ``search_depth`` traces (a full page) may have left some
        out, so its window is split and each part searched again (a trace found twice is kept once, span by
        span), until no window's page is full (:func:`_split`: at the page's oldest trace when the page holds
        the newest ones, as Badger and OpenSearch return them, else in halves). A window that is full and no
        wider than :data:`MIN_WINDOW` (or past :data:`MAX_SEARCHES` searches) cannot be split further: it is
        listed in ``Search.full`` so that the caller says what may be missing, never silently partial.
        ``finder``: what searches, with :meth:`find_traces`'s arguments (default that; the gRPC query's, which
        honours ``attributes``)."""
        result = Search()
        seen: set[tuple[str, str]] = set()
        windows = [(start, end)]
        while windows:
            lo, hi = windows.pop()
            page = (finder or self.find_traces)(
                service, lo, hi, attributes=attributes, operation=operation, search_depth=search_depth
            )
            result.searches += 1
            traces = trace_ids(page)
            result.resource_spans.extend(_new_spans(page, seen))
            if len(traces) < search_depth:
                continue
            if hi - lo <= MIN_WINDOW or result.searches + len(windows) >= MAX_SEARCHES:
                result.full.append((lo, hi, len(traces)))
                continue
            windows += _split(page, lo, hi)
        result.traces = len({t for t, _ in seen})
        return result

    def get_trace(self, trace_id: str) -> list[dict[str, Any]]:
        """The ``resourceSpans`` of one trace (hex id), or ``[]`` if Jaeger does not have it (yet)."""
        return self._resource_spans(self._get(f"/api/v3/traces/{trace_id}"))

    @staticmethod
    def _resource_spans(body: Any | None) -> list[dict[str, Any]]:
        if not body:
            return []
        result = body.get("result", body)
        spans = result.get("resourceSpans") if isinstance(result, dict) else None
        if spans is not None and not isinstance(spans, list):
            raise JaegerError("the answer's 'resourceSpans' is not a list")
        return list(spans or [])

    def wait_for(
        self,
        fetch: Callable[[], list[dict[str, Any]]],
        done: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float = 30.0,
        interval_s: float = 0.5,
    ) -> list[dict[str, Any]]:
        """Call ``fetch`` until ``done(result)`` or ``timeout_s`` passes; returns the last result."""
        deadline = time.monotonic() + timeout_s
        result = fetch()
        while not done(result) and time.monotonic() < deadline:
            time.sleep(interval_s)
            result = fetch()
        return result


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side that gives each read only what is left until ``deadline`` (``time.monotonic()``),
    raising :class:`TimeoutError` past it: a server dripping one byte at a time cannot stretch the call."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock, self._deadline = sock, deadline
        self._raw = sock.makefile("rb", buffering=0)  # the socket stays open while this reads (as makefile's)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(_left(self._deadline))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose reads and sends share one deadline (everything else is the socket's)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def sendall(self, data: Any, *args: Any) -> None:
        self._sock.settimeout(_left(self._deadline))
        self._sock.sendall(data, *args)

    def __getattr__(self, name: str) -> Any:
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
            this: Any = self  # its socket: a plain or a TLS one
            this.sock = _DeadlineSocket(this.sock, deadline)

    return Bounded


class _HttpHandler(urllib.request.HTTPHandler):
    """Plain HTTP, each connection bounded by the call's deadline."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_bounded(http.client.HTTPConnection, self._deadline), req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    """HTTPS (the default TLS checks), each connection bounded by the call's deadline."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_bounded(http.client.HTTPSConnection, self._deadline), req)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are followed to http(s) URLs only (urllib's own also follows ``ftp://``)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
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
    return urllib.request.build_opener(_HttpHandler(deadline), _HttpsHandler(deadline), _HttpOnlyRedirects())


@dataclass
class Search:
    """What :meth:`JaegerClient.find_all_traces` found: ``resource_spans`` (each span once), ``traces`` (distinct
    trace ids), ``searches`` made, and ``full``: the windows still returning a full page when they could not be
    split further (start, end, traces returned), whose other traces were NOT fetched."""

    resource_spans: list[dict[str, Any]] = field(default_factory=list)
    traces: int = 0
    searches: int = 0
    full: list[tuple[datetime, datetime, int]] = field(default_factory=list)

    def left_out(self, search_depth: int) -> str:
        """One line saying what may be missing (``""`` when nothing is)."""
        if not self.full:
            return ""
        windows = "; ".join(f"{_rfc3339(lo)} .. {_rfc3339(hi)} ({n} traces)" for lo, hi, n in self.full[:5])
        more = f" and {len(self.full) - 5} more windows" if len(self.full) > 5 else ""
        return (
            f"INCOMPLETE: {len(self.full)} time window(s) still returned a full page of --search-depth "
            f"{search_depth} traces and could not be split further; any traces beyond those in them were NOT "
            f"fetched ({self.traces} traces were): {windows}{more}; raise --search-depth (below Jaeger's max "
            "traces) to fetch them"
        )


def _spans(rs: Any) -> list[Any]:
    if not isinstance(rs, dict):
        return []
    out: list[Any] = []
    for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
        if isinstance(ss, dict) and isinstance(ss.get("spans"), list):
            out.extend(ss["spans"])
    return out


def _split(page: list[Any], lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
    """The windows to search after a full ``page`` of [lo, hi] (together they cover it; the last is searched
    first). A backend that returns the newest traces first (Badger scans its index backwards, OpenSearch sorts
    by start time) leaves out only traces older than the page's oldest one, at ``cut`` (the earliest of the
    traces' latest span starts): [lo, cut] is searched next as one window (each full page there moves the cut
    back by a page, like a cursor), and [cut, hi], which holds about the page, in halves to confirm it. When
    the page says nothing (no cut inside the window, as from a backend that returns any traces), in halves."""
    latest: dict[str, int] = {}
    for rs in page:
        for span in _spans(rs):
            try:
                trace, start = str(span["traceId"]), int(span["startTimeUnixNano"])
            except (KeyError, TypeError, ValueError):
                continue
            latest[trace] = max(start, latest.get(trace, start))
    if latest:
        cut = _UNIX + timedelta(microseconds=min(latest.values()) // 1000)
        if lo < cut < hi:
            mid = cut + (hi - cut) / 2
            return [(mid, hi), (cut, mid), (lo, cut)]
    mid = lo + (hi - lo) / 2
    return [(mid, hi), (lo, mid)]  # the older half first: pop() takes the last


def trace_ids(resource_spans: list[Any]) -> set[str]:
    return {str(s.get("traceId")) for rs in resource_spans for s in _spans(rs) if isinstance(s, dict)}


def _new_spans(resource_spans: list[Any], seen: set[tuple[str, str]]) -> list[Any]:
    """``resource_spans`` without the spans already in ``seen`` (by trace and span id), adding them to it."""
    out: list[Any] = []
    for rs in resource_spans:
        if not isinstance(rs, dict):
            out.append(rs)  # malformed: the decoder counts it
            continue
        scopes = []
        given = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []
        for ss in given:
            if not isinstance(ss, dict) or not isinstance(ss.get("spans"), list):
                scopes.append(ss)
                continue
            fresh = []
            for span in ss["spans"]:
                key = (str(span.get("traceId")), str(span.get("spanId"))) if isinstance(span, dict) else None
                if key is None or key not in seen:
                    fresh.append(span)
                    if key is not None:
                        seen.add(key)
            if len(fresh) == len(ss["spans"]):
                scopes.append(ss)  # nothing seen before: the entry as it came (most of a step's read)
            elif fresh:
                scopes.append({**ss, "spans": fresh})
        if (
            scopes
            and "instrumentationLibrarySpans" not in rs
            and len(scopes) == len(given)
            and all(a is b for a, b in zip(scopes, given, strict=True))
        ):
            out.append(rs)
        elif scopes:
            out.append({**{k: v for k, v in rs.items() if k != "instrumentationLibrarySpans"}, "scopeSpans": scopes})
    return out
