"""OTLP exporter headers: read once, as the OTel specification says, and checked for each transport.

Read (``_otlp.resolve_otlp``): ``OTEL_EXPORTER_OTLP_{SIGNAL}_HEADERS`` (``TRACES``, ``METRICS``), else
``OTEL_EXPORTER_OTLP_HEADERS``: the signal's variable replaces the generic one whole. Comma-separated
``key=value`` items, each key and value whitespace-trimmed and percent-decoded, names lowercased; a malformed
item is skipped with a warning.

Checked (:func:`http_headers`, :func:`grpc_metadata`): an item the transport cannot carry would fail every
export (``requests`` raises, gRPC answers ``INTERNAL: Invalid metadata`` or raises ``TypeError``), so it is
skipped with one warning naming it (never its value: headers carry credentials) and the rest is sent.

- HTTP (RFC 9110): the name is a token; the value holds no control character (CR, LF, NUL, ...; TAB is
  allowed) and is Latin-1 text (what ``http.client`` can send). Surrounding spaces and tabs are trimmed.
- gRPC: the key is lowercase ASCII ``[0-9a-z_.-]`` (names are lowercased first) and not ``grpc-...``
  (reserved by gRPC); the value is printable ASCII (space to ``~``). A key ending in ``-bin`` is binary
  metadata: its value is sent as the UTF-8 bytes of the decoded text (``x-token-bin=%00%01`` sends the two
  bytes; gRPC base64-encodes them on the wire), as OTLP exporters in other languages send it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._values import warn_once

__all__ = ["GrpcMetadata", "grpc_metadata", "http_headers"]

GrpcMetadata = tuple[tuple[str, str | bytes], ...]
"""gRPC call metadata: (key, value) pairs, a ``-bin`` key's value as bytes."""

_HTTP_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HTTP_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # all C0 controls but TAB, and DEL
_GRPC_KEY = re.compile(r"[0-9a-z_.\-]+")
_GRPC_VALUE = re.compile(r"[\x20-\x7e]*")


def _skip(transport: str, name: object, problem: str) -> None:
    warn_once(f"otlp-header:{transport}:{name!r}", "otel_agentloop: ignoring OTLP header %r: %s", name, problem)


def http_headers(headers: Mapping[str, object] | None) -> dict[str, str]:
    """``headers`` without the items HTTP cannot carry, each skipped with a warning naming it."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        text = value if isinstance(value, str) else str(value)
        if not isinstance(name, str) or not _HTTP_NAME.fullmatch(name):
            problem = "its name is not an HTTP token"
        elif _HTTP_BAD_VALUE.search(text):
            problem = "its value holds a control character (CR, LF, NUL, ...)"
        elif not text.isascii() and not _latin1(text):
            problem = "its value is not Latin-1 text"
        else:
            out[name] = text.strip(" \t")
            continue
        _skip("http", name, problem)
    return out


def grpc_metadata(headers: Mapping[str, object] | None) -> GrpcMetadata:
    """``headers`` as gRPC metadata (keys lowercased), without the items gRPC cannot carry, each skipped with a
    warning naming it."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in (headers or {}).items():
        key = name.lower() if isinstance(name, str) else name
        text = (value if isinstance(value, str) else str(value)).strip(" \t")
        if not isinstance(key, str) or not _GRPC_KEY.fullmatch(key):
            problem = "its name is not a gRPC metadata key (lowercase ASCII letters, digits, '_', '-', '.')"
        elif key.startswith("grpc-"):
            problem = "names starting with 'grpc-' are reserved by gRPC"
        elif key.endswith("-bin"):
            out.append((key, text.encode("utf-8", "replace")))
            continue
        elif not _GRPC_VALUE.fullmatch(text):
            problem = "its value is not printable ASCII (a '-bin' name carries bytes)"
        else:
            out.append((key, text))
            continue
        _skip("grpc", name, problem)
    return tuple(out)


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True
