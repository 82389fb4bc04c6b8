"""A small client for Jaeger's ``api_v3`` HTTP query API (stdlib only).

Answers are OTLP-JSON (``result.resourceSpans``, hex ids); :func:`otel_agentloop.decode_resource_spans`
turns them into :class:`~otel_agentloop.SpanRecord`. Built on ``/api/v3`` only: the legacy
``/api/traces?service=`` was removed on Jaeger's main branch. A missing trace or an empty search is a 404,
returned here as an empty list (poll past it while spans are in flight).

Each call is bounded as a whole (:func:`~._http.fetch_json`): connecting, sending, the answer's headers and its
body, and any redirects, together within the call's timeout, whatever the server drips; a redirect is followed
only to an http(s) URL, as the client's own URL check says.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, TypedDict, TypeVar

from ._http import JaegerError as JaegerError  # raised here, and imported from here by the readers
from ._http import fetch_json

if TYPE_CHECKING:
    from typing_extensions import Unpack

_UNIX = datetime(1970, 1, 1, tzinfo=timezone.utc)
MIN_WINDOW = timedelta(microseconds=1)
"""The narrowest time window :meth:`JaegerClient.find_all_traces` splits a full search into (the API takes
RFC 3339 times to the microsecond here)."""
MAX_SEARCHES = 4096
"""The most searches one :meth:`JaegerClient.find_all_traces` makes; past it, what is left is reported."""


ResourceSpans = list[object]
"""OTLP-JSON ``resourceSpans`` entries as a search answers them: unchecked (stored traces are untrusted input) until
:func:`~._decode.decode_resource_spans` reads them, or entries whose spans are already records
(:class:`~._decode.DecodedSpan`)."""
T = TypeVar("T")


def utc(t: datetime) -> datetime:
    """``t`` with its zone; a naive time is read as UTC (every search's rule)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _rfc3339(t: datetime) -> str:
    return utc(t).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


TRACES_PER_TIMEOUT = 1000
"""A search for N traces is bounded by ``timeout_s`` x N / this (at least ``timeout_s``)."""


@dataclass(frozen=True)
class TraceQuery:
    """One trace search, as every finder takes it (:meth:`JaegerClient.search`, ``GrpcQuery``, ``IndexQuery``):
    the traces of ``service`` in [start, end] whose spans match ``attributes`` (e.g. ``{"rl.step": "3"}``) and
    ``operation``, at most ``search_depth`` (below Jaeger's max-traces setting)."""

    service: str
    start: datetime
    end: datetime
    attributes: Mapping[str, str] | None = None
    operation: str | None = None
    search_depth: int = 500

    def within(self, start: datetime, end: datetime) -> TraceQuery:
        """This search in another window."""
        return replace(self, start=start, end=end)

    def timeout_s(self, timeout_s: float) -> float:
        """A call's bound: ``timeout_s`` per :data:`TRACES_PER_TIMEOUT` traces asked for (at least ``timeout_s``)."""
        return timeout_s * max(1.0, self.search_depth / TRACES_PER_TIMEOUT)


class SearchOptions(TypedDict, total=False):
    """A search's narrowing beyond its service and window, as :class:`TraceQuery` has it."""

    attributes: Mapping[str, str] | None
    operation: str | None
    search_depth: int


Finder = Callable[[TraceQuery], ResourceSpans]
"""A search: a :class:`TraceQuery` in, its ``resourceSpans`` out (:meth:`JaegerClient.search`'s answer)."""


class JaegerClient:
    """``JaegerClient("http://127.0.0.1:16686")``; every call is bounded by ``timeout_s``."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
            raise JaegerError(f"{base_url!r} is not an http(s) URL")  # urllib would also open file:// and ftp://
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(
        self, path: str, params: Mapping[str, str] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, object] | None:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        hint = " (is this Jaeger's query port?)"
        return fetch_json(url, f"GET {url}", self.base_url, timeout_s or self.timeout_s, hint=hint)

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
        self, service: str, start: datetime, end: datetime, **search: Unpack[SearchOptions]
    ) -> ResourceSpans:
        """The ``resourceSpans`` of the traces of ``service`` in [start, end], at most ``search_depth`` (below
        Jaeger's max-traces setting). ``attributes`` (e.g. ``{"rl.step": "3"}``) narrows the search where Jaeger
        supports ``query.attributes`` (newer than 2.13); callers still filter the spans they get. A search for
        more than :data:`TRACES_PER_TIMEOUT` traces may take ``timeout_s`` per that many (Jaeger's OpenSearch
        reader fetches each trace with a search of its own: 8,192 traces took 10-13 s here)."""
        query = TraceQuery(service, start, end, **search)
        depth = str(query.search_depth)
        params = {
            "query.service_name": service,
            "query.start_time_min": _rfc3339(start),
            "query.start_time_max": _rfc3339(end),
            "query.search_depth": depth,  # the name since Jaeger 2.14 ...
            "query.num_traces": depth,  # ... and before (2.13 here); each ignores the other
        }
        if query.operation:
            params["query.operation_name"] = query.operation
        if query.attributes:
            params["query.attributes"] = json.dumps(dict(query.attributes))
        return self._resource_spans(self._get("/api/v3/traces", params, timeout_s=query.timeout_s(self.timeout_s)))

    def search(self, query: TraceQuery) -> ResourceSpans:
        """:meth:`find_traces` of ``query``: the HTTP API's :data:`Finder`."""
        q = query
        return self.find_traces(
            q.service, q.start, q.end, attributes=q.attributes, operation=q.operation, search_depth=q.search_depth
        )

    def find_all_traces(
        self,
        service: str,
        start: datetime,
        end: datetime,
        *,
        finder: Finder | None = None,
        **search: Unpack[SearchOptions],
    ) -> Search:
        """Every trace :meth:`find_traces` would match in [start, end], not just one page of ``search_depth``.

        ``api_v3`` has no cursor: a search that returns ``search_depth`` traces (a full page) may have left some
        out, so its window is split and each part searched again (a trace found twice is kept once, span by
        span), until no window's page is full (:func:`_split`: at the page's oldest trace when the page holds
        the newest ones, as Badger and OpenSearch return them, else in halves). A window that is full and no
        wider than :data:`MIN_WINDOW` (or past :data:`MAX_SEARCHES` searches) cannot be split further: it is
        listed in ``Search.full`` so that the caller says what may be missing, never silently partial.
        ``finder``: what searches (default :meth:`search`; the gRPC query's, which honours ``attributes``)."""
        result = Search()
        seen: set[tuple[str, str]] = set()
        windows = [(start, end)]
        query = TraceQuery(service, start, end, **search)
        while windows:
            lo, hi = windows.pop()
            page = (finder or self.search)(query.within(lo, hi))
            result.searches += 1
            traces = trace_ids(page)
            result.resource_spans.extend(_new_spans(page, seen))
            if len(traces) < query.search_depth:
                continue
            if hi - lo <= MIN_WINDOW or result.searches + len(windows) >= MAX_SEARCHES:
                result.full.append((lo, hi, len(traces)))
                continue
            windows += _split(page, lo, hi)
        result.traces = len({t for t, _ in seen})
        return result

    def get_trace(self, trace_id: str) -> ResourceSpans:
        """The ``resourceSpans`` of one trace (hex id), or ``[]`` if Jaeger does not have it (yet)."""
        return self._resource_spans(self._get(f"/api/v3/traces/{trace_id}"))

    @staticmethod
    def _resource_spans(body: dict[str, object] | None) -> ResourceSpans:
        if not body:
            return []
        result = body.get("result", body)
        spans = result.get("resourceSpans") if isinstance(result, dict) else None
        if spans is not None and not isinstance(spans, list):
            raise JaegerError("the answer's 'resourceSpans' is not a list")
        return list(spans or [])

    def wait_for(
        self,
        fetch: Callable[[], T],
        done: Callable[[T], bool],
        timeout_s: float = 30.0,
        interval_s: float = 0.5,
    ) -> T:
        """Call ``fetch`` until ``done(result)`` or ``timeout_s`` passes; returns the last result."""
        deadline = time.monotonic() + timeout_s
        result = fetch()
        while not done(result) and time.monotonic() < deadline:
            time.sleep(interval_s)
            result = fetch()
        return result


@dataclass
class Search:
    """What :meth:`JaegerClient.find_all_traces` found: ``resource_spans`` (each span once), ``traces`` (distinct
    trace ids), ``searches`` made, and ``full``: the windows still returning a full page when they could not be
    split further (start, end, traces returned), whose other traces were NOT fetched."""

    resource_spans: ResourceSpans = field(default_factory=list)
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


def _spans(rs: object) -> list[object]:
    if not isinstance(rs, dict):
        return []
    out: list[object] = []
    for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
        if isinstance(ss, dict) and isinstance(ss.get("spans"), list):
            out.extend(ss["spans"])
    return out


def _split(page: ResourceSpans, lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
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
                trace, start = str(span["traceId"]), int(span["startTimeUnixNano"])  # type: ignore[index]
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


def trace_ids(resource_spans: ResourceSpans) -> set[str]:
    return {str(s.get("traceId")) for rs in resource_spans for s in _spans(rs) if isinstance(s, dict)}


def _new_spans(resource_spans: ResourceSpans, seen: set[tuple[str, str]]) -> ResourceSpans:
    """``resource_spans`` without the spans already in ``seen`` (by trace and span id), adding them to it."""
    out: ResourceSpans = []
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
