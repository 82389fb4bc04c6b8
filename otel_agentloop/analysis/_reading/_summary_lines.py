"""The step summaries of a large OTLP-JSON-lines file without parsing it whole: the lines that hold an
``rl.step.summary`` span are found in the mapped file, and only their summary spans are
parsed (:func:`read_summary_lines`)."""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterator

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ._decode import Skipped, decode_resource_spans

_NAME = b'"name":"' + sc.STEP_SUMMARY_SPAN.encode() + b'"'
_SPAN_START = b'{"traceId":'
_RESOURCE = b'{"resource":'
_DECODER = json.JSONDecoder()


def _summary_entries(raw: bytes) -> list[object] | None:
    """The summary spans of one line with their resources, parsed alone (a batch line is ~0.5 MB of sample spans
    around them): each span from its ``{"traceId":`` on, its resource from the enclosing ``{"resource":``, the
    layout the file exporters write. ``None`` when the line is laid out otherwise (then it is parsed whole)."""
    text = raw.decode("utf-8", errors="strict")
    entries: list[object] = []
    at = text.find(_NAME.decode())
    while at >= 0:
        span_at = text.rfind(_SPAN_START.decode(), 0, at)
        res_at = text.rfind(_RESOURCE.decode(), 0, at)
        if span_at < 0 or res_at < 0:
            return None
        span, _ = _DECODER.raw_decode(text, span_at)
        resource, _ = _DECODER.raw_decode(text, res_at + len(_RESOURCE))
        if not isinstance(span, dict) or span.get("name") != sc.STEP_SUMMARY_SPAN:
            return None
        entries.append({"resource": resource, "scopeSpans": [{"spans": [span]}]})
        at = text.find(_NAME.decode(), at + len(_NAME))
    return entries or None


def _whole_line_entries(raw: bytes) -> list[object]:
    obj = json.loads(raw)
    entries = obj.get("resourceSpans") if isinstance(obj, dict) else None
    picked: list[object] = []
    for rs in entries if isinstance(entries, list) else ():
        if not isinstance(rs, dict):
            continue
        spans = [
            s
            for ss in rs.get("scopeSpans") or ()
            if isinstance(ss, dict)
            for s in ss.get("spans") or ()
            if isinstance(s, dict) and s.get("name") == sc.STEP_SUMMARY_SPAN
        ]
        if spans:
            picked.append({"resource": rs.get("resource"), "scopeSpans": [{"spans": spans}]})
    return picked


def lines_with(path: str, needle: bytes) -> Iterator[tuple[int, bytes]]:
    """The lines of the file at ``path`` that contain ``needle``, with their byte offsets. The file is searched
    as one mapped buffer (no per-line work for the lines without it: several GB/s, not Python's ~0.8 GB/s of
    line iteration). Opening the file may raise ``OSError``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            at = mm.find(needle)
            while at >= 0:
                start = mm.rfind(b"\n", 0, at) + 1
                end = mm.find(b"\n", at)
                end = size if end < 0 else end
                yield start, mm[start:end]
                at = mm.find(needle, end)


def read_summary_lines(path: str, skipped: Skipped) -> Iterator[SpanRecord]:
    """The ``rl.step.summary`` spans of an OTLP-JSON-lines file. A line without one is skipped unparsed; in a line
    with one, only the summary spans and their resources are parsed when the layout allows (else the whole line).
    A malformed record is counted in ``skipped`` (``"byte N: ..."``, the line's offset)."""
    for offset, raw in lines_with(path, sc.STEP_SUMMARY_SPAN.encode()):
        where = f"byte {offset}: "
        try:
            try:
                entries = _summary_entries(raw)
            except (ValueError, RecursionError):
                entries = None
            if entries is None:
                entries = _whole_line_entries(raw)
        except (ValueError, RecursionError):
            skipped.add(f"{where}not JSON")
            continue
        yield from decode_resource_spans(entries, skipped, where)
