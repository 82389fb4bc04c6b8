"""Jaeger's stored span documents (OpenSearch/Elasticsearch) into records by Jaeger 2.13's own rules
(``from_dbmodel.go``): what ``report --opensearch`` reads. The e2e test in ``tests/e2e/test_opensearch_store.py``
checks the same records against Jaeger's api_v3 answer for real documents; these pin the rules our spans do not
exercise (typed and mistyped tags, elevated fields, HTTP status, references)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from otel_agentloop.analysis import Skipped, decode_resource_spans
from otel_agentloop.analysis._reading._decode_es import Resources, span
from otel_agentloop.analysis._reading._options import JaegerOptions
from otel_agentloop.analysis._reading._source import open_jaeger
from otel_agentloop.config import _local_stack

TRACE = "00000000000000010000000000000002"


def _doc(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "traceID": TRACE,
        "spanID": "00000000000000aa",
        "operationName": "rl.sample",
        "references": [],
        "startTime": 1_700_000_000_000_000,
        "duration": 1500,
        "tags": [],
        "process": {"serviceName": "svc", "tags": [{"key": "host.name", "type": "string", "value": "n1"}]},
    }
    doc.update(fields)
    return doc


def _records(*docs: Any) -> tuple[list[Any], Skipped]:
    resources = Resources()
    skipped = Skipped()
    page = [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span(d, resources) for d in docs]}]}]
    return list(decode_resource_spans(page, skipped)), skipped


def test_ids_times_resource_and_typed_tags() -> None:
    tags = [
        {"key": "s", "type": "string", "value": "x"},
        {"key": "i", "type": "int64", "value": 7},
        {"key": "i_text", "type": "int64", "value": "-3"},
        {"key": "f", "type": "float64", "value": 2},  # Go wrote float64(2) as 2: still a double
        {"key": "b", "type": "bool", "value": False},
        {"key": "b_text", "type": "bool", "value": "T"},
        {"key": "bin", "type": "binary", "value": "0aff"},
        {"key": "bad_int", "type": "int64", "value": "seven"},
        {"key": "bad_bool", "type": "bool", "value": 1},
        {"key": "odd", "type": "uint8", "value": "1"},
        {"key": "otel.scope.name", "type": "string", "value": "otel_agentloop"},
        {"key": "otel.scope.version", "type": "string", "value": "0.1.0"},
        {"key": "w3c.tracestate", "type": "string", "value": "a=b"},
    ]
    (record,), skipped = _records(_doc(tags=tags, tag={"rl@step": 3, "span@kind": "client"}))
    assert not skipped.count
    assert (record.trace_id, record.span_id, record.parent_id) == (1 << 64 | 2, 0xAA, 0)
    assert (record.start_ns, record.end_ns) == (1_700_000_000_000_000_000, 1_700_000_000_001_500_000)
    assert record.resource == {"service.name": "svc", "host.name": "n1"}
    assert record.kind == 2  # client, as the SDK numbers it
    attrs = dict(record.attributes)
    assert attrs.pop("bad_int").startswith("Can't convert the type int64 for the key bad_int")
    assert attrs == {
        "s": "x",
        "i": 7,
        "i_text": -3,
        "f": 2.0,
        "b": False,
        "b_text": True,
        "bin": b"\n\xff",
        "bad_bool": "invalid bool type in 1",
        "odd": "<Unknown Jaeger TagType 'uint8'>",
        "rl.step": 3,
    }
    assert isinstance(attrs["f"], float)


def test_status_from_error_otel_status_and_http() -> None:
    def status(*tags: tuple[str, str, Any], kind: str | None = None) -> tuple[bool, str, dict[str, Any]]:
        elevated = {"span@kind": kind} if kind else None
        (r,), _ = _records(_doc(tags=[{"key": k, "type": t, "value": v} for k, t, v in tags], tag=elevated))
        return r.error, r.status_message, dict(r.attributes)

    assert status(("error", "bool", True), ("otel.status_description", "string", "boom")) == (True, "boom", {})
    assert status(("otel.status_code", "string", "ERROR"), ("otel.status_description", "string", "x")) == (
        True,
        "x",
        {},
    )
    assert status(("otel.status_code", "string", "OK")) == (False, "", {})
    assert status(("error", "bool", False)) == (False, "", {"error": False})  # kept: only a true error is status
    code = ("http.response.status_code", "int64", 503)
    assert status(code)[0] is True
    four = ("http.response.status_code", "int64", 404)
    assert status(four, kind="server")[0] is False and status(four, kind="client")[0] is True


def test_parent_links_events_and_no_service() -> None:
    refs = [
        {"refType": "FOLLOWS_FROM", "traceID": TRACE, "spanID": "00000000000000bb"},
        {"refType": "CHILD_OF", "traceID": TRACE, "spanID": "00000000000000cc"},
        {"refType": "CHILD_OF", "traceID": "0000000000000000000000000000000f", "spanID": "00000000000000dd"},
    ]
    logs = [
        {"timestamp": 1_700_000_000_000_100, "fields": [{"key": "event", "type": "string", "value": "exception"}]},
        {"timestamp": 1_700_000_000_000_200, "fields": [{"key": "k", "type": "int64", "value": 1}]},
    ]
    process = {"serviceName": "OTLPResourceNoServiceName", "tags": []}
    (record,), _ = _records(_doc(references=refs, logs=logs, process=process))
    assert record.parent_id == 0xCC  # the first CHILD_OF in the trace
    assert record.links == ((1 << 64 | 2, 0xBB), (0xF, 0xDD))
    assert record.events == (("", 1_700_000_000_000_200_000, {"k": 1}), ("exception", 1_700_000_000_000_100_000, {}))
    assert record.resource == {}


def test_an_unreadable_document_is_skipped_with_its_reason() -> None:
    records, skipped = _records(_doc(spanID="zz"), _doc(startTime="soon"), "not a document", _doc())
    assert len(records) == 1 and skipped.count == 3
    assert "stored Jaeger span" in skipped.first and "not hex" in skipped.first


def test_tags_that_are_not_a_list_skip_the_document_alone() -> None:
    """A ``tags`` (or a process's ``tags``) that is a number, not a list: that document is skipped and counted, as
    any unreadable one; the read goes on (it raised ``TypeError`` out of the reader)."""
    process = {"serviceName": "svc", "tags": True}
    records, skipped = _records(_doc(tags=5), _doc(process=process), _doc())
    assert len(records) == 1 and skipped.count == 2
    assert "tags is not a list" in skipped.first


def test_the_local_stacks_opensearch_is_tried_for_the_local_jaeger_only(monkeypatch: Any) -> None:
    monkeypatch.delenv("OTEL_AGENTLOOP_STACK", raising=False)
    local = open_jaeger(JaegerOptions(_local_stack.jaeger_url(None), service="svc", timeout_s=5.0), print)
    assert local.index is not None and local.index.base_url == "http://127.0.0.1:9201" and not local.index_named
    assert open_jaeger(JaegerOptions("http://127.0.0.1:1/", service="svc"), print).index is None
    named = open_jaeger(JaegerOptions("http://127.0.0.1:1/", service="svc", opensearch="http://u:p@127.0.0.1:2"), print)
    assert named.index is not None and named.index_named and named.index.base_url == "http://127.0.0.1:2"


@pytest.mark.e2e  # a subprocess
def test_opensearch_with_a_file_is_refused(tmp_path: Any) -> None:
    (tmp_path / "t.jsonl").write_text("")
    cmd = [sys.executable, "-m", "otel_agentloop", "report", "--file", str(tmp_path / "t.jsonl"), "--opensearch"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "--opensearch reads the store of a Jaeger" in done.stderr


def test_adjusted_as_jaegers_query_service_answers() -> None:
    """Jaeger's query service sorts attributes by key and events by name, and writes an IP number as text: so
    does this reader (the page and Perfetto files then equal those read through Jaeger, byte for byte)."""
    tags = [
        {"key": "zeta", "type": "string", "value": "z"},
        {"key": "ip", "type": "int64", "value": 3232235777},
        {"key": "alpha", "type": "string", "value": "a"},
    ]
    logs = [
        {"timestamp": 1_700_000_000_000_300, "fields": [{"key": "event", "type": "string", "value": "zz"}]},
        {"timestamp": 1_700_000_000_000_100, "fields": [{"key": "event", "type": "string", "value": "aa"}]},
        {
            "timestamp": 1_700_000_000_000_200,
            "fields": [
                {"key": "event", "type": "string", "value": "aa"},
                {"key": "y", "type": "int64", "value": 1},
                {"key": "x", "type": "int64", "value": 2},
            ],
        },
    ]
    process = {"serviceName": "svc", "tags": [{"key": "z.r", "type": "string", "value": "1"}], "tag": {"a@r": "2"}}
    (record,), _ = _records(_doc(tags=tags, logs=logs, process=process))
    assert list(record.attributes.items()) == [("alpha", "a"), ("ip", "192.168.1.1"), ("zeta", "z")]
    assert [(name, list(attrs)) for name, _, attrs in record.events] == [("aa", []), ("aa", ["x", "y"]), ("zz", [])]
    assert list(record.resource) == ["a.r", "service.name", "z.r"]
