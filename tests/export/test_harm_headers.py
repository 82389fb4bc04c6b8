"""A header item the transport cannot carry never fails the export (issue 26).

``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` with items gRPC or HTTP cannot carry (a non-ASCII or non-Latin-1 value,
a control character, a name that is no token, a ``-bin`` key): through ``configure()`` and the real exporters
against real loopback receivers, the spans are exported, the other headers arrive, and each item the
transport cannot carry is skipped with one warning that names it and never shows its value.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

import otel_agentloop as oal
from tests._support.header_servers import serve, serve_metrics
from tests._support.otlp_receiver import Receiver, wait_for

ITEMS = {
    "x-ok": ("1", "1"),
    "x-tenant": ("%C3%A9quipe-secret1", "\u00e9quipe-secret1"),  # Latin-1: HTTP carries it, gRPC (ASCII) cannot
    "x-token-bin": ("t0k-secret2", "t0k-secret2"),  # gRPC binary metadata: sent as bytes
    "x-euro": ("%E2%82%AC-secret3", None),  # neither ASCII nor Latin-1
    "x-newline": ("a%0Ainjected-secret4", None),  # a control character
    "x-nul": ("a%00-secret5", None),
    "bad%20name": ("secret6", None),  # not an HTTP token, not a gRPC key
    "grpc-custom": ("secret7", "secret7"),  # reserved by gRPC
}
"""name as written: (value as written, value decoded)."""

SKIPPED = {
    "grpc": {"x-tenant", "x-euro", "x-newline", "x-nul", "bad name", "grpc-custom"},
    "http/protobuf": {"x-euro", "x-newline", "x-nul", "bad name"},
    "http/json": {"x-euro", "x-newline", "x-nul", "bad name"},
}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_header_items_the_transport_cannot_carry_are_skipped_and_the_rest_is_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    receiver = Receiver()
    endpoint, stop = serve(protocol, receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-generic=replaced")  # the traces variable wins whole
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", ", ".join(f" {k} = {v} " for k, (v, _) in ITEMS.items()))
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            handle = oal.configure("headers", set_global=False, schedule_delay_s=0.05)
            try:
                for index in range(2):  # two exports: still one warning per item
                    with oal.sample(index, step=1):
                        pass
                    assert handle.force_flush(10)
                stats = handle.stats
            finally:
                handle.shutdown(2)
    finally:
        stop()
    assert stats["exported"] == 2 and stats["failed"] == 0 and stats["dropped"] == 0, stats
    assert len(receiver.records) == 2 and len(receiver.headers) == 2
    skipped = SKIPPED[protocol]
    expected: dict[str, object] = {name: value for name, (_, value) in ITEMS.items() if name not in skipped}
    if protocol == "grpc":
        expected["x-token-bin"] = b"t0k-secret2"
    for sent in receiver.headers:
        assert {k: sent.get(k) for k in expected} == expected
        assert not skipped & set(sent) and "x-generic" not in sent
    _assert_warned_once_each(caplog, skipped)


def _assert_warned_once_each(caplog: pytest.LogCaptureFixture, skipped: set[str]) -> None:
    for name in skipped:
        warned = [r for r in caplog.records if repr(name) in r.getMessage()]
        assert len(warned) == 1, (name, [r.getMessage() for r in caplog.records])
    assert "secret" not in caplog.text  # a header's value is never shown


# -- the library's metrics (the SDK's OTLP metric exporter) -----------------------------------------------
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_metric_header_items_the_transport_cannot_carry_are_skipped_and_the_rest_is_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    headers: list[dict[str, object]] = []
    endpoint, stop = serve_metrics(protocol, headers)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-generic=replaced")  # the metrics variable wins whole
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", ",".join(f"{k}={v}" for k, (v, _) in ITEMS.items()))
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            handle = oal.configure("metric-headers", set_global=False)
            try:
                with oal.sample(0, step=1):
                    pass
            finally:
                handle.shutdown(5)  # the metric reader's last export
            assert wait_for(lambda: bool(headers), 5)
    finally:
        stop()
    skipped = SKIPPED[protocol]
    expected: dict[str, object] = {name: value for name, (_, value) in ITEMS.items() if name not in skipped}
    if protocol == "grpc":
        expected["x-token-bin"] = b"t0k-secret2"
    for sent in headers:
        assert {k: sent.get(k) for k in expected} == expected
        assert not skipped & set(sent) and "x-generic" not in sent
    _assert_warned_once_each(caplog, skipped)
    assert not _sdk_complaints(caplog), Counter(r.name for r in caplog.records)


def test_metrics_over_grpc_with_only_an_item_grpc_cannot_carry_send_no_headers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing left to send: the SDK's exporter must not fall back to the variable's (unchecked) items."""
    headers: list[dict[str, object]] = []
    endpoint, stop = serve_metrics("grpc", headers)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=%C3%A9quipe-secret1")
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            handle = oal.configure("metric-headers", set_global=False)
            handle.shutdown(5)  # the metric reader's last export
            assert wait_for(lambda: bool(headers), 5)
    finally:
        stop()
    assert all("x-tenant" not in sent for sent in headers)
    _assert_warned_once_each(caplog, {"x-tenant"})


_SHUTDOWN_NOTES = ("Shutdown in progress", "already shutdown")


def _sdk_complaints(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The SDK exporters' own log lines, less those of an exporter of an earlier test still shutting down (its
    retry loop notes its shutdown from a background thread, into whatever test runs then)."""
    return [
        r
        for r in caplog.records
        if r.name.startswith("opentelemetry") and not any(note in r.getMessage() for note in _SHUTDOWN_NOTES)
    ]
