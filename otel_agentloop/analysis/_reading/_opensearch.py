"""A step's traces read straight from the OpenSearch (or Elasticsearch) that a Jaeger stores them in.

Jaeger's own search over OpenSearch fetches each trace it finds with a search of its own (8,194 searches for an
8,192-sample step: 24-30 s on 2 cores, whatever the filter), so ``report --opensearch URL`` reads Jaeger's span
indices itself: the step's trace ids by one aggregation (``rl.step``, the service and the window, as Jaeger's
trace-id search matches them: a span's tags, its process's tags, its logs' fields, or their elevated ``tag``
fields), then their spans by a search per :data:`IDS_PER_SEARCH` ids, a page of :data:`PAGE` at a time (3.3 s for
those 41,000 spans). The documents become the same records Jaeger's answer would give (:mod:`._decode_es`).

:meth:`IndexQuery.find_traces` answers as :meth:`~._jaeger.JaegerClient.find_traces` does (``resourceSpans``,
at most ``search_depth`` traces, the newest first), so the window splitting of ``find_all_traces`` applies
unchanged. Every call is bounded by ``timeout_s`` (:data:`~._jaeger.TRACES_PER_TIMEOUT` traces per
``timeout_s``), connecting and reading included.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime

from ._decode_es import Resources, span
from ._gc import gc_paused
from ._http import JaegerError, fetch_json
from ._jaeger import ResourceSpans, TraceQuery, utc
from ._json import JsonObject as Json
from ._json import JsonValue, dig
from ._text import printable

DEFAULT_INDEX = "*jaeger-span-*"
"""Jaeger's span indices under any prefix (``<prefix>-jaeger-span-YYYY-MM-DD`` and its aliases)."""
IDS_PER_SEARCH = 1024
"""Trace ids per span search (a ``terms`` query)."""
PAGE = 10_000
"""Spans per answer (OpenSearch's default ``max_result_window``); more are paged with ``search_after``."""
MAX_BUCKETS = 50_000
"""The most trace ids one aggregation asks for (OpenSearch refuses more than 65,535 buckets); a step with more is
found window by window, as a full page of any search."""

Progress = Callable[[int], None]


class IndexQuery:
    """``IndexQuery("http://127.0.0.1:9201", timeout_s=10)``: Jaeger's span documents in that cluster, searched
    as Jaeger searches them. ``url`` may carry ``user:password@`` (basic authentication)."""

    def __init__(self, url: str, index: str = DEFAULT_INDEX, timeout_s: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise JaegerError(f"--opensearch {printable(url, 200)!r} is not an http(s) URL")
        self._auth = ""
        if parts.username is not None:
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self._auth = "Basic " + base64.b64encode(pair.encode()).decode()
        netloc = parts.netloc.rpartition("@")[2]
        self.base_url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.index, self.timeout_s = index, timeout_s
        self.target = f"{self.base_url}/{index}"
        """What is read, for the progress lines (no password)."""

    def _post(self, path: str, body: Json, timeout_s: float) -> dict[str, object]:
        url = f"{self.base_url}/{urllib.parse.quote(self.index, safe='*,-_')}{path}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        request.add_header("Content-Type", "application/json")
        if self._auth:
            request.add_header("Authorization", self._auth)
        return fetch_json(request, f"POST {self.target}{path}", self.base_url, timeout_s, absent_ok=False) or {}

    def services(self) -> list[str] | None:
        """The services in the span indices (one aggregation; none when no index matches), ``None`` when they
        cannot be read there (not OpenSearch or Elasticsearch, refused)."""
        body: Json = {"size": 0, "aggs": {"s": {"terms": {"field": "process.serviceName", "size": 10_000}}}}
        try:
            return _bucket_keys(self._post("/_search", body, self.timeout_s), "s")
        except (JaegerError, KeyError):
            return None

    def find_traces(self, query: TraceQuery, progress: Progress | None = None) -> ResourceSpans:
        """The ``resourceSpans`` of the newest ``search_depth`` traces of the query's service with a span in its
        window that matches its ``attributes`` and ``operation`` (their spans as :class:`~._decode.DecodedSpan`);
        ``[]`` for none. Raises :class:`~._jaeger.JaegerError`."""
        timeout_s = query.timeout_s(self.timeout_s)
        deadline = time.monotonic() + timeout_s
        ids = self._trace_ids(query, timeout_s)
        spans: list[object] = []
        resources = Resources()
        with gc_paused():  # tens of thousands of records, no cycles
            for first in range(0, len(ids), IDS_PER_SEARCH):
                for doc in self._spans(ids[first : first + IDS_PER_SEARCH], deadline):
                    spans.append(span(doc, resources))
                if progress is not None:
                    progress(min(first + IDS_PER_SEARCH, len(ids)))
        return [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}] if spans else []

    def _trace_ids(self, query: TraceQuery, timeout_s: float) -> list[str]:
        must: list[JsonValue] = [
            {"range": {"startTimeMillis": {"gte": _millis(query.start), "lte": _millis(query.end)}}},
            {"term": {"process.serviceName": query.service}},
        ]
        if query.operation:
            must.append({"term": {"operationName": query.operation}})
        must += [_tag_query(key, value) for key, value in (query.attributes or {}).items()]
        size = min(max(query.search_depth, 1), MAX_BUCKETS)
        by_trace: Json = {  # the newest first, as Jaeger orders its trace-id search
            "terms": {"field": "traceID", "size": size, "order": [{"newest": "desc"}]},
            "aggs": {"newest": {"max": {"field": "startTime"}}},
        }
        body: Json = {"size": 0, "query": {"bool": {"filter": must}}, "aggs": {"ids": by_trace}}
        answer = self._post("/_search", body, timeout_s)
        try:
            return _bucket_keys(answer, "ids")
        except KeyError:
            raise JaegerError(f"POST {self.target}/_search: no trace-id aggregation in the answer") from None

    def _spans(self, ids: list[str], deadline: float) -> list[object]:
        """Every stored span of the traces ``ids``, a page of :data:`PAGE` at a time."""
        out: list[object] = []
        after: list[JsonValue] | None = None
        while True:
            body: Json = {
                "size": PAGE,
                "query": {"terms": {"traceID": list[JsonValue](ids)}},
                "sort": [{"startTime": "asc"}, {"traceID": "asc"}, {"spanID": "asc"}],
            }
            if after is not None:
                body["search_after"] = after
            left = deadline - time.monotonic()
            if left <= 0:
                raise JaegerError(f"POST {self.target}/_search: the step's spans not read within the timeout")
            answer = self._post("/_search", body, left)
            try:
                hits = dig(answer, "hits", "hits")
                if not isinstance(hits, list):
                    raise TypeError
                out += [hit["_source"] for hit in hits]  # a hit that is not an object raises TypeError
            except (KeyError, TypeError):
                raise JaegerError(f"POST {self.target}/_search: the answer holds no hits") from None
            if len(hits) < PAGE:
                return out
            after = hits[-1].get("sort")
            if not isinstance(after, list):
                raise JaegerError(f"POST {self.target}/_search: a page without its sort values")


def _bucket_keys(answer: dict[str, object], name: str) -> list[str]:
    """The keys of the buckets of aggregation ``name`` in ``answer``, ``[]`` when no index matches (any more);
    ``KeyError`` when the answer has no such buckets."""
    if "aggregations" not in answer and isinstance(answer.get("hits"), dict):
        return []
    buckets = dig(answer, "aggregations", name, "buckets")
    if not isinstance(buckets, list):
        raise KeyError("buckets")
    return [str(dig(b, "key")) for b in buckets]


def _millis(t: datetime) -> int:
    return max(int(utc(t).timestamp() * 1000), 0)


_NESTED = ("tags", "process.tags", "logs.fields")
"""Where Jaeger keeps tags as nested key-value documents."""


def _nested(path: str, key: str, value: str) -> Json:
    """A span with a nested key-value document ``key``: ``value`` at ``path``."""
    match: Json = {"bool": {"filter": [{"term": {f"{path}.key": key}}, {"term": {f"{path}.value": value}}]}}
    return {"nested": {"path": path, "query": match}}


def _tag_query(key: str, value: str) -> Json:
    """A span whose tag ``key`` is ``value``, wherever Jaeger keeps it (as its ``buildTagQuery``)."""
    elevated = key.replace(".", "@")
    should: list[JsonValue] = [
        {"term": {f"tag.{elevated}": value}},
        {"term": {f"process.tag.{elevated}": value}},
    ]
    should += [_nested(path, key, value) for path in _NESTED]
    return {"bool": {"should": should, "minimum_should_match": 1}}
