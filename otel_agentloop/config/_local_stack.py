"""The local stack of ``make up`` (``scripts/stack.py``): which one (``OTEL_AGENTLOOP_STACK``), its ports, its run
and data directories, and the addresses that ``report --jaeger`` (no URL) and ``scripts/stack.py env`` give.

The one place these are derived: the scripts load this file by its path (they run under a bare ``python3``, without
this package's dependencies), so it imports nothing but the standard library and reads no variable itself: each
caller passes the stack's name (``None``: the default stack).

A named stack's ports are the default ports plus :func:`port_offset`, a multiple of :data:`OFFSET_STEP` from the
name's CRC-32: deterministic, and no port of one stack is a port of another (the step is no difference of two
default ports); every port stays below 32768, the kernel's usual range for outgoing connections. `up` checks the
ports are free before it starts anything; two names may map to the same offset (1 in :data:`OFFSET_SLOTS`): `up`
then names the busy ports, and another name (or a port variable) resolves it.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

VARIABLE = "OTEL_AGENTLOOP_STACK"
DEFAULT_PORTS = {
    "grpc": 4317,
    "http": 4318,
    "prometheus": 8889,
    "otelcol_health": 13134,
    "otelcol_metrics": 8890,
    "query": 16686,
    "query_grpc": 16685,
    "jaeger_health": 13133,
    "jaeger_metrics": 8888,
    "jaeger_otlp_grpc": 14317,
    "jaeger_otlp_http": 14318,
    "gateway_grpc": 4417,
    "gateway_http": 4418,
    "gateway_health": 13135,
    "gateway_metrics": 8891,
}
"""The default stack's ports (``scripts/stack_lib.PORT_VARS`` names the variable that moves each one)."""
OPENSEARCH_PORT_BASE = 9200
"""The cluster store's nodes: HTTP on base+1..3, transport on base+101..103."""
OFFSET_STEP = 65
OFFSET_SLOTS = 247
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def check_name(raw: str) -> str:
    """``raw`` as a stack's name (stripped): 1-32 letters, digits, ``_``, ``.``, ``-``, starting with a letter or
    digit (it names directories); ``ValueError`` with the reason otherwise."""
    name = raw.strip()
    if not _NAME.fullmatch(name):
        raise ValueError("is not a stack name (1-32 letters, digits, '_', '.', '-'; a letter or digit first)")
    return name


def port_offset(name: str | None) -> int:
    """What a stack's ports add to the defaults: 0 for the default stack (``None``), else ``OFFSET_STEP`` times
    1 + CRC-32(name) mod ``OFFSET_SLOTS`` (65 .. 16055)."""
    if name is None:
        return 0
    return OFFSET_STEP * (1 + zlib.crc32(check_name(name).encode()) % OFFSET_SLOTS)


def ports(name: str | None) -> dict[str, int]:
    """Stack ``name``'s ports, before any port variable moves one."""
    offset = port_offset(name)
    return {key: port + offset for key, port in DEFAULT_PORTS.items()}


def opensearch_port_base(name: str | None) -> int:
    return OPENSEARCH_PORT_BASE + port_offset(name)


def run_dir(cache: Path, name: str | None) -> Path:
    """Where stack ``name`` keeps its state, lock and logs, below the cache ``cache``."""
    return cache / "run" if name is None else cache / f"run-{check_name(name)}"


def data_dir(data: Path, name: str | None) -> Path:
    """Where stack ``name`` keeps its traces (``jaeger/``, ``opensearch/``) and queues, below ``data``."""
    return data if name is None else data / "stacks" / check_name(name)


def jaeger_url(name: str | None) -> str:
    """Stack ``name``'s Jaeger query API (what ``report --jaeger`` reads when given no URL)."""
    return f"http://127.0.0.1:{ports(name)['query']}"


def opensearch_url(name: str | None) -> str:
    """Stack ``name``'s first OpenSearch node (``make up STORE=opensearch``; what ``report --opensearch`` reads
    when given no URL, and ``report --jaeger`` of the local stack tries)."""
    return f"http://127.0.0.1:{opensearch_port_base(name) + 1}"


def otlp_grpc_endpoint(name: str | None) -> str:
    """Stack ``name``'s Collector, OTLP over gRPC (what ``scripts/stack.py env`` exports)."""
    return f"http://127.0.0.1:{ports(name)['grpc']}"
