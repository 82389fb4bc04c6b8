"""Jaeger's span documents in OpenSearch or Elasticsearch (its ``jaeger-span-*`` indices) straight into
:class:`~otel_agentloop.metrics.SpanRecord`: the records that Jaeger's own api_v3 answer for the same documents
gives (:mod:`._decode_pb`), by the rules Jaeger 2.13 converts them with (``from_dbmodel.go`` of its
Elasticsearch trace store):

- the resource: ``service.name`` from ``process.serviceName``, then ``process.tags`` and the elevated
  ``process.tag`` fields (``@`` for ``.`` in their keys);
- attributes: ``tags``, then the elevated ``tag`` fields, each by its declared type (a string of another type is
  parsed; one that does not parse, or a value of the wrong type, becomes Jaeger's error text);
  ``otel.scope.name``/``otel.scope.version`` are taken out, ``span.kind`` becomes the kind, ``error``,
  ``otel.status_code``/``otel.status_description`` (or, failing both, ``http.response.status_code``) the status,
  ``w3c.tracestate`` is dropped;
- the parent: the first ``CHILD_OF`` reference within the trace (else the first ``FOLLOWS_FROM``, else
  ``parentSpanID``); the other references are links; ``logs`` are events (named by their ``event`` field);
- times: microseconds (Jaeger keeps no finer) as nanoseconds, the end as start plus duration;
- then as Jaeger's query service adjusts every answer (its standard adjusters): attributes sorted by key (the
  resource's, the span's, each event's), events by name, an ``ip``/``peer.ipv4`` number as dotted text.

A document that cannot be read (an id that is not hex, a field of the wrong shape) is handed on as an
:class:`~._decode.UnreadableSpan`: :func:`~._decode.decode_resource_spans` skips and counts it, with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...metrics._records import SpanRecord
from ._decode import _INT64, AttrValue, DecodedSpan, UnreadableSpan
from ._text import printable

_KINDS = {"internal": 0, "server": 1, "client": 2, "producer": 3, "consumer": 4}
"""Jaeger's ``span.kind`` values as the SDK's SpanKind (``_decode._kind``'s); any other is unspecified (0)."""
NO_SERVICE = "OTLPResourceNoServiceName"
"""What Jaeger stores for a resource without ``service.name``; read back as none."""


class _DocumentError(ValueError):
    """A document this reader cannot read."""


def _number(kind: str, value: object) -> int | float | None:
    """A non-string value declared ``int64``/``float64`` (Go's ``fromDBNumber``); ``None`` where Jaeger drops
    it (a float declared int64 that is not whole-number text)."""
    if kind == "int64":
        if isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64:
            return value
        return None  # Go's json.Number.Int64 fails: Jaeger puts nothing
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _typed(tag: Mapping[str, object]) -> tuple[str, AttrValue]:
    """One stored tag ``{"key", "type", "value"}`` as (key, value), by ``dbTagsToAttributes``."""
    key, kind, value = str(tag.get("key", "")), str(tag.get("type", "")), tag.get("value")
    if not isinstance(value, str):
        if kind in ("int64", "float64"):
            number = _number(kind, value)
            return key, number if number is not None else _invalid(kind, value)
        if kind == "bool" and isinstance(value, bool):
            return key, value
        return key, _invalid(kind, value)
    try:
        if kind == "string":
            return key, value
        if kind == "bool":
            return key, _parse_bool(value)
        if kind == "int64":
            number = int(value, 10)
            if not -_INT64 <= number < _INT64:
                raise ValueError(f"value out of range: {value}")
            return key, number
        if kind == "float64":
            return key, float(value)
        if kind == "binary":
            return key, bytes.fromhex(value)
    except ValueError as exc:
        return key, f"Can't convert the type {kind} for the key {key}: {exc}"
    return key, f"<Unknown Jaeger TagType {kind!r}>"


_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def _parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"parsing {text!r}: invalid syntax")


def _invalid(kind: str, value: object) -> str:
    return f"invalid {kind} type in {value}"


def _elevated(value: object) -> AttrValue:
    """An elevated tag field's value, typed by its JSON (``convertTagField``): whole numbers in int64 range are
    int64, other numbers float64."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else float(value)
    if isinstance(value, float):
        return value
    return f"invalid tag type in {value}"


def _tags(nested: object, elevated: object) -> dict[str, AttrValue]:
    """The nested ``tags`` list, then the elevated ``tag`` fields, as attributes (a later key replaces an earlier
    one's value)."""
    out: dict[str, AttrValue] = {}
    if nested:
        if not isinstance(nested, list):
            raise _DocumentError("tags is not a list")
        for tag in nested:
            if not isinstance(tag, Mapping):
                raise _DocumentError("a tag is not an object")
            key, value = _typed(tag)
            out[key] = value
    if elevated:
        if not isinstance(elevated, Mapping):
            raise _DocumentError("tag is not an object")
        for key, value in elevated.items():
            out[str(key).replace("@", ".")] = _elevated(value)
    return out


def _status(attrs: dict[str, AttrValue], kind: int) -> tuple[bool, str]:
    """(error, message) from the status tags, which are taken out of ``attrs`` (``setSpanStatus``)."""
    code, message, known = 0, "", False
    if attrs.get("error") is True:
        del attrs["error"]
        code, known = 2, True
        if "otel.status_description" in attrs:
            message = _str(attrs.pop("otel.status_description"))
        elif "http.status_message" in attrs:
            message = _str(attrs["http.status_message"])
    if "otel.status_code" in attrs:
        text = attrs.pop("otel.status_code")
        if not known:
            known = True
            code = {"OK": 1, "ERROR": 2}.get(_str(text).upper(), 0)
            if "otel.status_description" in attrs:
                message = _str(attrs.pop("otel.status_description"))
    elif not known and "http.response.status_code" in attrs:
        http = _http_code(attrs["http.response.status_code"])
        if http is not None:
            # a 4xx is the caller's fault: unset on a server span; 1xx-3xx unset; any other an error
            if (kind != 1) if 400 <= http < 500 else not 100 <= http < 399:
                code, known = 2, True
            if "http.status_message" in attrs:
                message = _str(attrs["http.status_message"])
    return (code == 2, message) if known else (False, "")


def _http_code(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value, 10)
        except ValueError:
            return None
    return None


def _str(value: object) -> str:
    """A value as pdata's ``Str()`` reads it: a string's text, else empty."""
    return value if isinstance(value, str) else ""


def _hex_id(text: object, nbytes: int) -> int:
    if not isinstance(text, str) or not text or len(text) > 2 * nbytes:
        raise _DocumentError(f"id {text!r} is not hex of at most {nbytes} bytes")
    try:
        return int(text, 16)
    except ValueError:
        raise _DocumentError(f"id {text!r} is not hex") from None


_IP_KEYS = ("ip", "peer.ipv4")


def _adjusted(attrs: dict[str, AttrValue]) -> dict[str, AttrValue]:
    """``attrs`` as Jaeger's query service answers them: sorted by key, an IP number as dotted text."""
    for key in _IP_KEYS:
        value = attrs.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = int(value) & 0xFFFFFFFF  # Go's uint32 conversion keeps the low 32 bits
            attrs[key] = ".".join(str(number >> shift & 0xFF) for shift in (24, 16, 8, 0))
    return dict(sorted(attrs.items()))


def _parent_and_links(doc: Mapping[str, object], trace: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    refs = doc.get("references") or []
    if not isinstance(refs, list):
        raise _DocumentError("references is not a list")
    parent, follows = "", ""
    for ref in refs:
        if not isinstance(ref, Mapping):
            raise _DocumentError("a reference is not an object")
        if ref.get("traceID") != trace:
            continue
        if ref.get("refType") == "CHILD_OF":
            parent = str(ref.get("spanID", ""))
            break
        if not follows and ref.get("refType") == "FOLLOWS_FROM":
            follows = str(ref.get("spanID", ""))
    parent = parent or follows
    links = tuple(
        (_hex_id(ref.get("traceID"), 16), _hex_id(ref.get("spanID"), 8))
        for ref in refs
        if not (ref.get("spanID") == parent and ref.get("refType") == "CHILD_OF")
    )
    if parent:
        return _hex_id(parent, 8), links
    raw = doc.get("parentSpanID")
    return (_hex_id(raw, 8) if raw else 0), links


def _micros(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value * 1000 < _INT64:
        raise _DocumentError(f"time {value!r} is not microseconds")
    return value * 1000


def _events(logs: object) -> tuple[tuple[str, int, dict[str, AttrValue]], ...]:
    if not logs:
        return ()
    if not isinstance(logs, list):
        raise _DocumentError("logs is not a list")
    out = []
    for log in logs:
        if not isinstance(log, Mapping):
            raise _DocumentError("a log is not an object")
        attrs = _tags(log.get("fields"), None)
        name = attrs.get("event")
        if isinstance(name, str):
            del attrs["event"]
        else:
            name = ""
        out.append((name, _micros(log.get("timestamp")), dict(sorted(attrs.items()))))
    return tuple(sorted(out, key=lambda event: event[0]))  # by name, stably


class Resources:
    """The resources of one read, each distinct one made once (the spans of a process share it)."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, AttrValue]] = {}

    def of(self, process: object) -> dict[str, AttrValue]:
        if not isinstance(process, Mapping):
            raise _DocumentError("process is not an object")
        key = repr(process)
        resource = self._seen.get(key)
        if resource is None:
            service = process.get("serviceName")
            resource = {}
            if isinstance(service, str) and service and service != NO_SERVICE:
                resource["service.name"] = service
            resource.update(_tags(process.get("tags"), process.get("tag")))
            resource = _adjusted(resource)
            self._seen[key] = resource
        return resource


def _record(doc: Mapping[str, object], resources: Resources) -> SpanRecord:
    trace = doc.get("traceID")
    attrs = _tags(doc.get("tags"), doc.get("tag"))
    for scope_key in ("otel.scope.name", "otel.scope.version"):  # the scope: not kept in a record
        if isinstance(attrs.get(scope_key), str):
            del attrs[scope_key]
        elif scope_key == "otel.scope.name":
            break  # the version is taken out only beside a name
    kind = 0
    if "span.kind" in attrs:
        kind = _KINDS.get(_str(attrs.pop("span.kind")), 0)
    error, message = _status(attrs, kind)
    attrs.pop("w3c.tracestate", None)
    parent, links = _parent_and_links(doc, str(trace))
    start = _micros(doc.get("startTime"))
    end = start + _micros(doc.get("duration"))
    if end >= _INT64:
        raise _DocumentError("the span ends past int64 nanoseconds")
    name = doc.get("operationName")
    return SpanRecord(
        trace_id=_hex_id(trace, 16),
        span_id=_hex_id(doc.get("spanID"), 8),
        parent_id=parent,
        name=name if isinstance(name, str) else "",
        start_ns=start,
        end_ns=end,
        attributes=_adjusted(attrs),
        error=error,
        status_message=message,
        kind=kind,
        resource=resources.of(doc.get("process") or {}),
        events=_events(doc.get("logs")),
        links=links,
    )


def span(doc: object, resources: Resources) -> dict[str, object]:
    """One stored span document as a :class:`~._decode.DecodedSpan` (or, unreadable, an
    :class:`~._decode.UnreadableSpan` saying why)."""
    if not isinstance(doc, Mapping):
        return UnreadableSpan("a stored Jaeger span is not an object")
    try:
        record = _record(doc, resources)
    except _DocumentError as exc:
        trace, span_id = printable(doc.get("traceID"), 40), printable(doc.get("spanID"), 20)
        return UnreadableSpan(f"stored Jaeger span {trace}/{span_id}: {exc}", traceId=str(doc.get("traceID")))
    return DecodedSpan(
        record, traceId=record.trace_id_hex, spanId=format(record.span_id, "016x"), startTimeUnixNano=record.start_ns
    )
