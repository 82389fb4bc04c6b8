"""The trace reader against hostile stored traces (issue 21): a malformed record is skipped and counted, never
raised; `report --file` says how many it skipped and why, in one line, and still reports the good samples; span
trees of any depth, self-parents and cycles are drawn without recursion. CLI checks run the real CLI as a
subprocess; the property test runs it in-process (hypothesis) and a few of its shapes also as subprocesses."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import Skipped, decode_resource_spans, read_jsonl
from tests._support.otlp_lines import otlp_line, otlp_span, run_cli, run_main, sample_attrs, sample_spans


# -- malformed shapes: each one a span of an otherwise good file ----------------------------------------------------
def _set(path: str, value: Any) -> Any:
    """A mutation of a good span: ``path`` (``a.b.0``) set to ``value`` (``...`` deletes it)."""

    def mutate(span: dict[str, Any]) -> dict[str, Any]:
        span = copy.deepcopy(span)
        *parents, last = path.split(".")
        node: Any = span
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is ...:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
        return span

    return mutate


BIG = 10**30
SPAN_SHAPES = {
    "start is NaN": _set("startTimeUnixNano", float("nan")),
    "start is Infinity": _set("startTimeUnixNano", float("inf")),
    "start beyond int64": _set("startTimeUnixNano", str(1 << 64)),
    "start is a huge int": _set("startTimeUnixNano", BIG),
    "start is negative": _set("startTimeUnixNano", -5),
    "start is text": _set("startTimeUnixNano", "soon"),
    "start is a list": _set("startTimeUnixNano", [1]),
    "end before start": _set("endTimeUnixNano", "1"),
    "end is an object": _set("endTimeUnixNano", {"x": 1}),
    "name is a number": _set("name", 5),
    "name is a list": _set("name", ["a"]),
    "attributes is an object": _set("attributes", {"a": 1}),
    "attributes is a string": _set("attributes", "x"),
    "an attribute is a string": _set("attributes.0", "x"),
    "an attribute key is a number": _set("attributes.0.key", 7),
    "an attribute value is a list": _set("attributes.0.value", [1]),
    "intValue beyond int64": _set("attributes.0.value", {"intValue": str(1 << 70)}),
    "intValue is a float text": _set("attributes.0.value", {"intValue": "1.5"}),
    "intValue is an object": _set("attributes.0.value", {"intValue": {}}),
    "doubleValue is text": _set("attributes.0.value", {"doubleValue": "fast"}),
    "boolValue is a string": _set("attributes.0.value", {"boolValue": "yes"}),
    "arrayValue is a string": _set("attributes.0.value", {"arrayValue": "x"}),
    "kvlistValue values is a number": _set("attributes.0.value", {"kvlistValue": {"values": 3}}),
    "bytesValue is not base64": _set("attributes.0.value", {"bytesValue": "!!"}),
    "traceId is a number": _set("traceId", 12),
    "traceId is 40 bytes": _set("traceId", "ab" * 40),
    "spanId is not hex nor base64": _set("spanId", "zz!"),
    "status is a list": _set("status", [2]),
    "status code is a list": _set("status", {"code": [2]}),
    "status message is a number": _set("status", {"code": 2, "message": 5}),
    "kind is an object": _set("kind", {}),
    "events is an object": _set("events", {"a": 1}),
    "an event time is NaN": _set("events", [{"name": "e", "timeUnixNano": float("nan")}]),
    "links is a string": _set("links", "x"),
    "a link is a number": _set("links", [3]),
    "the span is a list": lambda span: [span],
    "the span is null": lambda span: None,
}
LINE_SHAPES: dict[str, bytes] = {
    "not JSON": b'{"resourceSpans": [',
    "invalid UTF-8": b'{"resourceSpans": []}\xff\xfe',
    "a JSON number": b"42",
    "a JSON list": b"[1, 2]",
    "resourceSpans is an object": b'{"resourceSpans": {"a": 1}}',
    "resourceSpans is a number": b'{"resourceSpans": 7}',
    "resourceSpans holds a string": b'{"resourceSpans": ["x"]}',
    "scopeSpans is a string": b'{"resourceSpans": [{"scopeSpans": "x"}]}',
    "resource is a list": b'{"resourceSpans": [{"resource": [], "scopeSpans": []}]}',
    "spans is an object": b'{"resourceSpans": [{"scopeSpans": [{"spans": {}}]}]}',
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "an int of 5000 digits": b'{"resourceSpans": ' + b"9" * 5000 + b"}",
}


_NONE: Any = object()


def _good_file(path: Path, bad_line: bytes | None = None, bad_span: Any = _NONE) -> None:
    """Three good samples, with one bad line or one bad span (which may be ``None``) as line 2."""
    lines = [otlp_line(sample_spans(i)).encode() for i in range(3)]
    if bad_span is not _NONE:
        lines.insert(1, otlp_line([bad_span]).encode())
    if bad_line is not None:
        lines.insert(1, bad_line)
    path.write_bytes(b"\n".join(lines) + b"\n")


def _victim() -> dict[str, Any]:
    """A span of a fourth sample, carrying an attribute at index 0 for the mutations to hit."""
    return sample_spans(3)[1]


@pytest.mark.parametrize("shape", list(SPAN_SHAPES))
def test_each_malformed_span_is_skipped_and_counted_in_process(tmp_path: Path, shape: str) -> None:
    path = tmp_path / "t.jsonl"
    _good_file(path, bad_span=SPAN_SHAPES[shape](_victim()))
    skipped = Skipped()
    records = list(read_jsonl(str(path), skipped))
    assert skipped.count == 1, (shape, skipped)
    assert skipped.first.startswith("line 2: ")
    assert len(records) == 12  # the three good samples, whole
    rc, out, err = run_main(["report", "--file", str(path)])
    assert rc == 0, err
    assert f"skipped 1 malformed record in {path} (first: line 2: " in err
    assert "samples: 3" in out


@pytest.mark.parametrize("shape", list(LINE_SHAPES))
def test_each_malformed_line_is_skipped_and_counted_in_process(tmp_path: Path, shape: str) -> None:
    path = tmp_path / "t.jsonl"
    _good_file(path, bad_line=LINE_SHAPES[shape])
    skipped = Skipped()
    assert len(list(read_jsonl(str(path), skipped))) == 12
    assert skipped.count == 1 and skipped.first.startswith("line 2: "), (shape, skipped)
    rc, out, err = run_main(["report", "--file", str(path)])
    assert rc == 0 and "samples: 3" in out, err


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    "shape", ["start is NaN", "start beyond int64", "name is a number", "intValue beyond int64", "the span is a list"]
)
def test_report_skips_a_malformed_span_with_one_line_not_a_traceback(tmp_path: Path, shape: str) -> None:
    _good_file(tmp_path / "t.jsonl", bad_span=SPAN_SHAPES[shape](_victim()))
    proc = run_cli(["report", "--file", "t.jsonl"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    skip_lines = [line for line in proc.stderr.splitlines() if "malformed" in line]
    assert len(skip_lines) == 1 and "skipped 1 malformed record in t.jsonl (first: line 2: " in skip_lines[0]
    assert "samples: 3" in proc.stdout


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("shape", ["invalid UTF-8", "an int of 5000 digits", "nested 100000 deep", "a JSON list"])
def test_report_skips_a_malformed_line_with_one_line_not_a_traceback(tmp_path: Path, shape: str) -> None:
    _good_file(tmp_path / "t.jsonl", bad_line=LINE_SHAPES[shape])
    proc = run_cli(["report", "--file", "t.jsonl", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["metrics"]["agent_loop/num_samples"] == 3
    assert proc.stderr.count("skipped 1 malformed record in t.jsonl (first: line 2: ") == 1, proc.stderr


def test_a_good_file_reports_nothing_skipped(tmp_path: Path) -> None:
    _good_file(tmp_path / "t.jsonl")
    rc, out, err = run_main(["report", "--file", str(tmp_path / "t.jsonl")])
    assert rc == 0 and "malformed" not in err and "samples: 3" in out


def test_decode_resource_spans_counts_and_survives_non_list_input() -> None:
    skipped = Skipped()
    assert list(decode_resource_spans(5, skipped)) == []  # type: ignore[arg-type]
    assert list(decode_resource_spans([{"scopeSpans": [{"spans": [None, sample_spans(0)[0]]}]}], skipped))
    assert skipped.count == 2 and skipped.first == "resourceSpans is not a list"


# -- span trees: depth, self-parents and cycles ----------------------------------------------------------------------
def _chain_file(path: Path, depth: int, *, extra: Sequence[dict[str, Any]] = ()) -> None:
    a = sample_attrs(0)
    spans = [otlp_span(sc.SAMPLE_SPAN, 1, end_ms=depth + 10, attrs=a)]
    spans += [otlp_span(f"step {i}", i + 2, parent=i + 1, start_ms=i, end_ms=i + 5, attrs=a) for i in range(depth)]
    path.write_text(otlp_line([*spans, *extra]) + "\n")


@pytest.mark.slow  # 1500 rows drawn to text, HTML and PNG: about 40 s at load 7
def test_a_parent_chain_1500_deep_is_drawn_whole(tmp_path: Path) -> None:
    """In this process (deeper in the stack than a fresh CLI, under the same recursion limit), bounded by the
    suite's timeout rather than a subprocess's: a loaded machine can take minutes to draw 1500 rows."""
    _chain_file(tmp_path / "t.jsonl", 1500)
    assert sys.getrecursionlimit() < 1500  # a recursive walk would fail here
    rc, out, err = run_main(["report", "--file", "t.jsonl", "--sample", "0", "--html", "page.html", "--png", "w.png"])
    assert rc == 0, err[-2000:]
    drawn = [line for line in out.splitlines() if "|" in line]
    assert len(drawn) == 1501  # every span once
    assert "page.html" in out and (tmp_path / "page.html").stat().st_size > 0
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"  # the first MAX_PNG_ROWS spans


@pytest.mark.e2e  # a subprocess
def test_a_span_that_is_its_own_parent_and_a_cycle_are_each_drawn_once(tmp_path: Path) -> None:
    a = sample_attrs(0)
    extra = [
        otlp_span("selfish", 0x50, parent=0x50, start_ms=1, attrs=a),
        otlp_span("ring a", 0x60, parent=0x61, start_ms=2, attrs=a),
        otlp_span("ring b", 0x61, parent=0x62, start_ms=3, attrs=a),
        otlp_span("ring c", 0x62, parent=0x60, start_ms=4, attrs=a),
    ]
    _chain_file(tmp_path / "t.jsonl", 2, extra=extra)
    proc = run_cli(["report", "--file", "t.jsonl", "--sample", "0", "--timeline-png", "t.png"], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    labels = [line.split("|")[0].strip() for line in proc.stdout.splitlines() if "|" in line]
    assert sorted(labels) == sorted(["rl.sample", "step 0", "step 1", "selfish", "ring a", "ring b", "ring c"])


# -- property: arbitrary JSON lines never raise out of `report` -----------------------------------------------------
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
SPAN_PATHS = [
    "name",
    "traceId",
    "spanId",
    "parentSpanId",
    "kind",
    "startTimeUnixNano",
    "endTimeUnixNano",
    "attributes",
    "attributes.0",
    "attributes.0.key",
    "attributes.0.value",
    "attributes.0.value.intValue",
    "attributes.1.value",
    "status",
    "status.code",
    "status.message",
    "events",
    "links",
]


@st.composite
def hostile_lines(draw: st.DrawFn) -> bytes:
    """A random JSON line, a good sample with one field replaced by random JSON, or random bytes."""
    kind = draw(st.sampled_from(["json", "span", "span", "bytes"]))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=40)).replace(b"\n", b" ")
    spans = sample_spans(draw(st.integers(0, 5)))
    victim = draw(st.integers(0, len(spans) - 1))
    spans[victim] = _set(draw(st.sampled_from(SPAN_PATHS)), draw(json_values))(spans[victim])
    return otlp_line(spans).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_lines(), min_size=1, max_size=4), st.booleans())
def test_arbitrary_json_lines_never_raise_out_of_report(lines: list[bytes], good: bool) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(b"\n".join([*lines, *([otlp_line(sample_spans(9)).encode()] if good else [])]) + b"\n")
        rc, _out, err = run_main(["report", "--file", str(path), "--html", str(Path(tmp) / "p.html")])
        assert rc in (0, 1), err
        assert "Traceback" not in err
        skip = [line for line in err.splitlines() if "malformed" in line]
        assert len(skip) <= 1
        if rc == 1:  # nothing to report: one line says so (after the skip count, if any)
            assert len([line for line in err.splitlines() if line.strip()]) - len(skip) == 1, err
        if good:
            assert rc == 0, err
