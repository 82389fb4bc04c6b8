"""Reading stored spans: OTLP-JSON ``resourceSpans`` (the file exporters', Jaeger's ``api_v3``, protobuf's JSON
with base64 ids) into :class:`~otel_agentloop.metrics.SpanRecord`.

Stored traces are untrusted input. Each record is checked on its own: a line that is not UTF-8 or not JSON, an
entry of the wrong shape, a span whose fields have the wrong type, a time that is not an integer in [0, 2**63),
an int beyond int64, an id of the wrong length: that record alone is skipped and counted in :class:`Skipped`
(with the first reason), never raised. Nothing here recurses without a bound.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from ... import semconv as sc
from ...metrics._records import SpanRecord

_INT64 = 1 << 63
_DECIMAL = re.compile(r"-?[0-9]{1,20}")
_HEX = re.compile(r"[0-9a-fA-F]+")
MAX_VALUE_DEPTH = 64
"""How deeply ``arrayValue``/``kvlistValue`` are read in one attribute value (OTLP allows any depth): as deep as
the library writes (``core._values.MAX_DEPTH``). A value nested deeper (the SDK path writes any depth) keeps its
span: the attribute reads as :data:`TOO_DEEP`."""
TOO_DEEP = f"<nested deeper than {MAX_VALUE_DEPTH} levels: not read>"
AttrValue: TypeAlias = str | int | float | bool | bytes | tuple["AttrValue", ...] | dict[str, "AttrValue"] | None
"""An attribute value as read: OTLP's ``AnyValue`` (an array a tuple, a key-value list a dict, none ``None``)."""


class BadRecordError(ValueError):
    """A stored record that cannot be read; the message says why."""


class _TooDeepError(BadRecordError):
    """An attribute value nests deeper than :data:`MAX_VALUE_DEPTH` (its attribute reads as :data:`TOO_DEEP`)."""


@dataclass
class Skipped:
    """Records skipped as malformed: how many, and the first reason (``"line 7: ..."``)."""

    count: int = 0
    first: str = ""

    def add(self, reason: str) -> None:
        self.count += 1
        if not self.first:
            self.first = reason

    def summary(self, source: str) -> str:
        """One line for people, ``""`` when nothing was skipped."""
        if not self.count:
            return ""
        plural = "record" if self.count == 1 else "records"
        return f"skipped {self.count} malformed {plural} in {source} (first: {self.first})"


def _mapping(raw: object, what: str) -> Mapping[str, object]:
    if type(raw) is dict:  # what json.loads makes: skip the ABC check
        return raw
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise BadRecordError(f"{what} is not an object")
    return raw


def _list(raw: object, what: str) -> list[object]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRecordError(f"{what} is not a list")
    return raw


def _str(raw: object, what: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise BadRecordError(f"{what} is not a string")
    return raw


def _int64(raw: object, what: str, *, unsigned: bool = False) -> int:
    """An OTLP-JSON integer: a JSON number without a fraction or a decimal string (protobuf's int64 form)."""
    if isinstance(raw, bool):
        raise BadRecordError(f"{what} is not an integer")
    if isinstance(raw, int):
        value = raw
    elif (isinstance(raw, float) and math.isfinite(raw) and raw.is_integer()) or (
        isinstance(raw, str) and _DECIMAL.fullmatch(raw)
    ):
        value = int(raw)
    else:
        raise BadRecordError(f"{what} is not an integer")
    low = 0 if unsigned else -_INT64
    if not low <= value < _INT64:
        raise BadRecordError(f"{what} {value} is out of range")
    return value


def _time(raw: object, what: str) -> int:
    return 0 if raw is None else _int64(raw, what, unsigned=True)


def _id(raw: object, nbytes: int, what: str) -> int:
    """A trace or span id: hex (OTLP-JSON) or base64 (protobuf's JSON) of exactly ``nbytes``; missing is 0."""
    if raw is None or raw == "":
        return 0
    if not isinstance(raw, str):
        raise BadRecordError(f"{what} is not a string")
    if len(raw) == 2 * nbytes and _HEX.fullmatch(raw):
        return int(raw, 16)
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise BadRecordError(f"{what} is neither hex nor base64") from None
    if len(data) != nbytes:
        raise BadRecordError(f"{what} is not {nbytes} bytes")
    return int.from_bytes(data, "big")


def _double(raw: object, what: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise BadRecordError(f"{what} is not a number")
    try:
        return float(raw)  # protobuf's JSON spells NaN and infinities as strings; OTel allows them
    except (ValueError, OverflowError):
        raise BadRecordError(f"{what} is not a number") from None


def _value(raw: object, what: str, depth: int = 0) -> AttrValue:
    """One ``AnyValue``; an unknown or empty one is ``None``. Nesting is bounded by :data:`MAX_VALUE_DEPTH`."""
    if depth > MAX_VALUE_DEPTH:
        raise _TooDeepError(f"{what} nests deeper than {MAX_VALUE_DEPTH}")
    v = _mapping(raw, what)
    if "stringValue" in v:
        return _str(v["stringValue"], what)
    if "intValue" in v:
        return _int64(v["intValue"], what)
    if "doubleValue" in v:
        return _double(v["doubleValue"], what)
    if "boolValue" in v:
        flag = v["boolValue"]
        if not isinstance(flag, bool):
            raise BadRecordError(f"{what} is not a boolean")
        return flag
    if "arrayValue" in v:
        items = _list(_mapping(v["arrayValue"], what).get("values"), what)
        return tuple(_value(x, what, depth + 1) for x in items)
    if "bytesValue" in v:
        try:
            return base64.b64decode(_str(v["bytesValue"], what), validate=True)
        except (binascii.Error, ValueError):
            raise BadRecordError(f"{what} is not base64") from None
    if "kvlistValue" in v:
        items = _list(_mapping(v["kvlistValue"], what).get("values"), what)
        return dict(_key_value(kv, what, depth + 1) for kv in items)
    return None


def _key_value(raw: object, what: str, depth: int = 0) -> tuple[str, AttrValue]:
    kv = _mapping(raw, what)
    key = kv.get("key")
    if not isinstance(key, str):
        raise BadRecordError(f"{what}: a key is not a string")
    value = kv.get("value")
    if type(value) is dict:  # the common well-formed scalars, without building the error label; else below
        if "stringValue" in value:
            if type(value["stringValue"]) is str:
                return key, value["stringValue"]
        elif "intValue" in value:
            raw_int = value["intValue"]
            if (type(raw_int) is str and _DECIMAL.fullmatch(raw_int)) or type(raw_int) is int:
                number = int(raw_int)
                if -_INT64 <= number < _INT64:
                    return key, number
        elif "doubleValue" in value:
            if type(value["doubleValue"]) is float:
                return key, value["doubleValue"]
        elif "boolValue" in value and type(value["boolValue"]) is bool:
            return key, value["boolValue"]
    try:
        decoded = _value(value, f"attribute {key[:40]!r}", depth)
    except _TooDeepError:
        if depth:
            raise
        return key, TOO_DEEP  # the attribute, not its span: the span's phase time still counts
    if key in LABELS and isinstance(decoded, (dict, tuple)):
        return key, _label(decoded)
    return key, decoded


LABELS = frozenset(
    (sc.RL_PHASE, sc.GEN_AI_TOOL_NAME, sc.ERROR_TYPE, sc.RL_WORKER, sc.RL_RUN_ID, sc.RL_RUN_ATTEMPT, "service.name")
)
"""Attributes the views group and index by (a phase, a tool, a run): a stored key-value list or array there is
read as its JSON text, so that no view meets an unhashable value (the live side only writes strings there)."""


def _label(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))


def _attrs(raw: object, what: str) -> dict[str, AttrValue]:
    return dict(_key_value(kv, what) for kv in _list(raw, what))


def _status_code(raw: object) -> int:
    if isinstance(raw, str):  # protobuf JSON may spell enums by name
        return {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(raw, 0)
    return 0 if raw is None else _int64(raw, "status.code")


_KINDS = (
    "SPAN_KIND_UNSPECIFIED",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_CONSUMER",
)


def _kind(raw: object) -> int:
    if isinstance(raw, str):
        value = _KINDS.index(raw) if raw in _KINDS else 1
    else:
        value = 1 if raw is None else _int64(raw, "kind")
    return min(max(value - 1, 0), len(_KINDS) - 2)  # back to the SDK's SpanKind value (0..4)


class DecodedSpan(dict[str, object]):
    """A span already read into its ``record`` (from protobuf: ``_decode_pb``), in a ``resourceSpans`` entry: its
    ``traceId``, ``spanId`` (hex) and ``startTimeUnixNano`` as OTLP-JSON keys, for the searches' bookkeeping
    (``_jaeger.find_all_traces``); :func:`decode_resource_spans` yields ``record`` as it is."""

    __slots__ = ("record",)

    def __init__(self, record: SpanRecord, **keys: object) -> None:
        super().__init__(keys)
        self.record = record


class UnreadableSpan(dict[str, object]):
    """A span a reader could not read (``_decode_es``'s stored documents), in a ``resourceSpans`` entry with its
    ``traceId`` (and ``spanId``) as far as known: :func:`decode_resource_spans` skips it and counts ``reason``."""

    __slots__ = ("reason",)

    def __init__(self, reason: str, **keys: object) -> None:
        super().__init__(keys)
        self.reason = reason


def decode_span(s: object, resource: Mapping[str, object]) -> SpanRecord:
    """One OTLP-JSON span; raises :class:`BadRecordError` saying what is wrong with it."""
    if not isinstance(s, Mapping):
        raise BadRecordError("a span is not an object")
    status = _mapping(s.get("status"), "status")
    start = _time(s.get("startTimeUnixNano"), "startTimeUnixNano")
    end = _time(s.get("endTimeUnixNano"), "endTimeUnixNano")
    if end < start:
        raise BadRecordError("endTimeUnixNano is before startTimeUnixNano")
    events = []
    for e in _list(s.get("events"), "events"):
        e = _mapping(e, "event")
        events.append(
            (
                _str(e.get("name"), "event name"),
                _time(e.get("timeUnixNano"), "event timeUnixNano"),
                _attrs(e.get("attributes"), "event attributes"),
            )
        )
    links = []
    for link in _list(s.get("links"), "links"):
        link = _mapping(link, "link")
        links.append((_id(link.get("traceId"), 16, "link traceId"), _id(link.get("spanId"), 8, "link spanId")))
    return SpanRecord(
        trace_id=_id(s.get("traceId"), 16, "traceId"),
        span_id=_id(s.get("spanId"), 8, "spanId"),
        parent_id=_id(s.get("parentSpanId"), 8, "parentSpanId"),
        name=_str(s.get("name"), "name"),
        start_ns=start,
        end_ns=end,
        attributes=_attrs(s.get("attributes"), "attributes"),
        error=_status_code(status.get("code")) == 2,
        status_message=_str(status.get("message"), "status.message"),
        kind=_kind(s.get("kind")),
        resource=resource,
        events=tuple(events),
        links=tuple(links),
    )


def decode_resource_spans(
    resource_spans: Iterable[object], skipped: Skipped | None = None, where: str = ""
) -> Iterator[SpanRecord]:
    """Spans of OTLP-JSON ``resourceSpans`` entries (also accepts the legacy ``instrumentationLibrarySpans``).

    A malformed entry or span is skipped and counted in ``skipped`` (``where`` prefixes its reason, e.g.
    ``"line 7: "``); the others are still read.
    """
    skipped = skipped if skipped is not None else Skipped()
    if not isinstance(resource_spans, Iterable) or isinstance(resource_spans, (str, bytes, Mapping)):
        skipped.add(f"{where}resourceSpans is not a list")
        return
    for rs in resource_spans:
        try:
            rs = _mapping(rs, "a resourceSpans entry")
            resource = _attrs(_mapping(rs.get("resource"), "resource").get("attributes"), "resource attributes")
            scopes = _list(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans"), "scopeSpans")
        except BadRecordError as exc:
            skipped.add(f"{where}{exc}")
            continue
        for ss in scopes:
            try:
                spans = _list(_mapping(ss, "a scopeSpans entry").get("spans"), "spans")
            except BadRecordError as exc:
                skipped.add(f"{where}{exc}")
                continue
            for s in spans:
                if type(s) is DecodedSpan:
                    yield s.record
                    continue
                if type(s) is UnreadableSpan:
                    skipped.add(f"{where}{s.reason}")
                    continue
                try:
                    record = decode_span(s, resource)
                except BadRecordError as exc:
                    skipped.add(f"{where}{exc}")
                    continue
                yield record


DEEP_LINE_LEVELS = 20_000
"""JSON nesting a line may have beyond the interpreter's recursion limit (:func:`loads_line`); deeper, the line is
not JSON to ``report``."""
_DEEP_STACK = 256 << 20
"""The stack of the thread that parses such a line (address space; only what the parse uses is touched)."""


def loads_line(text: str) -> object:
    """``json.loads(text)``; a line nested past the recursion limit (an attribute the SDK path stored hundreds of
    levels deep: 3 JSON levels a level) is parsed again in a thread of its own with a large stack and a limit
    raised by :data:`DEEP_LINE_LEVELS`, so that its spans are read (the value itself reads as :data:`TOO_DEEP`).
    Raises ``ValueError`` or ``RecursionError`` as ``json.loads`` does."""
    try:
        return json.loads(text)
    except RecursionError:
        pass
    out: list[object] = []

    def parse() -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + DEEP_LINE_LEVELS)  # the caller waits in join(): no other frame runs meanwhile
        try:
            out.append(json.loads(text))
        except (ValueError, RecursionError) as exc:
            out.append(exc)
        finally:
            sys.setrecursionlimit(limit)

    previous = threading.stack_size(_DEEP_STACK)
    try:
        thread = threading.Thread(target=parse, name="otel-agentloop-deep-line", daemon=True)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    if not out:
        raise RecursionError("the line could not be parsed")
    parsed = out[0]
    if isinstance(parsed, (ValueError, RecursionError)):
        raise parsed
    return parsed


def read_jsonl(path: str, skipped: Skipped | None = None, label: str = "") -> Iterator[SpanRecord]:
    """Spans of an OTLP-JSON-lines file (ours, or the Collector file exporter's).

    A line that is not UTF-8, not JSON or not an object, and a malformed span, are skipped and counted in
    ``skipped`` (the reason starts with ``label``, e.g. the segment's name, then ``line N: ``). Opening the file
    may raise ``OSError`` (missing, a directory, not readable).
    """
    skipped = skipped if skipped is not None else Skipped()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{label}line {number}: "
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                skipped.add(f"{where}not UTF-8")
                continue
            if not line:
                continue
            try:
                obj = loads_line(line)
            except (ValueError, RecursionError):  # not JSON, an int of more than 4300 digits, nested too deep
                skipped.add(f"{where}not JSON")
                continue
            if not isinstance(obj, dict):
                skipped.add(f"{where}not a JSON object")
                continue
            yield from decode_resource_spans(obj.get("resourceSpans") or (), skipped, where)
