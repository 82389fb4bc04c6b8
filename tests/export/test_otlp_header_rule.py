"""One rule for OTLP headers on every protocol and both signals (issue 41, item 10), read off real receivers.

The rule (the SDK 1.45's OTLP/HTTP exporters', ``_resolve_headers``): the environment's headers
(``OTEL_EXPORTER_OTLP_{SIGNAL}_HEADERS``, else ``OTEL_EXPORTER_OTLP_HEADERS``: the signal's replaces the generic one
whole), updated item by item with the ``headers`` argument (names lowercased; the argument wins a name both
give). The argument reaches the metrics' exporter as the endpoint argument does: unless
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` sends the metrics elsewhere (then only the environment's are sent there).
"""

from __future__ import annotations

import pytest

import otel_agentloop as oal
from tests._support.header_servers import serve, serve_metrics
from tests._support.otlp_receiver import Receiver, wait_for

ARGUMENT = {"X-Arg": "from-argument", "x-both": "argument"}


def _traces_headers(monkeypatch: pytest.MonkeyPatch, protocol: str, **kw: object) -> dict[str, object]:
    """The headers of the first export of one span, with ``configure(**kw)`` against a real receiver."""
    receiver = Receiver()
    endpoint, stop = serve(protocol, receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    try:
        handle = oal.configure("header-rule", set_global=False, schedule_delay_s=0.05, **kw)  # type: ignore[arg-type]
        try:
            with oal.sample(0, step=1):
                pass
            assert handle.force_flush(10)
        finally:
            handle.shutdown(2)
    finally:
        stop()
    assert receiver.headers, "nothing arrived"
    return dict(receiver.headers[0])


def _picked(sent: dict[str, object], *names: str) -> dict[str, object]:
    return {name: sent[name] for name in names if name in sent}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_traces_send_the_environment_updated_with_the_argument(monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-env=generic,x-both=environment")
    sent = _traces_headers(monkeypatch, protocol, headers=ARGUMENT)
    assert _picked(sent, "x-env", "x-arg", "x-both") == {
        "x-env": "generic",
        "x-arg": "from-argument",
        "x-both": "argument",
    }


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_the_traces_variable_replaces_the_generic_one_and_the_argument_updates_it(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-env=generic,x-both=environment")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-signal=traces,x-both=traces")
    sent = _traces_headers(monkeypatch, protocol, headers=ARGUMENT)
    assert _picked(sent, "x-env", "x-signal", "x-arg", "x-both") == {
        "x-signal": "traces",
        "x-arg": "from-argument",
        "x-both": "argument",
    }


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_an_empty_argument_leaves_the_environments_headers(monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-env=generic")
    assert _picked(_traces_headers(monkeypatch, protocol, headers={}), "x-env") == {"x-env": "generic"}


def _metric_headers(monkeypatch: pytest.MonkeyPatch, protocol: str) -> dict[str, object]:
    """The headers of the metrics' last export (at shutdown) with ``configure(headers=ARGUMENT)``, the generic
    endpoint the metrics receiver's."""
    headers: list[dict[str, object]] = []
    endpoint, stop = serve_metrics(protocol, headers)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.removesuffix("/v1/metrics"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    try:
        handle = oal.configure("header-rule", set_global=False, headers=ARGUMENT)
        handle.shutdown(5)  # the metric reader's last export
        assert wait_for(lambda: bool(headers), 5)
    finally:
        stop()
    return dict(headers[-1])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_metrics_send_their_environment_updated_with_the_argument(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-env=generic,x-both=environment")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-signal=metrics,x-both=metrics")
    sent = _metric_headers(monkeypatch, protocol)
    assert _picked(sent, "x-env", "x-signal", "x-arg", "x-both") == {
        "x-signal": "metrics",
        "x-arg": "from-argument",
        "x-both": "argument",
    }


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_metrics_sent_elsewhere_by_their_variable_get_only_the_environments(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    headers: list[dict[str, object]] = []
    endpoint, stop = serve_metrics(protocol, headers)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-env=generic")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    try:
        handle = oal.configure("header-rule", set_global=False, headers=ARGUMENT)
        handle.shutdown(5)
        assert wait_for(lambda: bool(headers), 5)
    finally:
        stop()
    assert _picked(dict(headers[-1]), "x-env", "x-arg", "x-both") == {"x-env": "generic"}
