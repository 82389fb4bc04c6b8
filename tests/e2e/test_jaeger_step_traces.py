"""A step's pages from Jaeger read only that step's traces, with progress on stderr (issue 38, item 7).

Against the real Jaeger v2.13 on Badger, with its HTTP and gRPC query ports paired as ``make up`` and Jaeger's
defaults pair them (16686/16685: the gRPC port is the HTTP port's neighbour below). A job ran three steps in a
few seconds, so each step's window (its summary's time, widened by ``STEP_WINDOW_SLACK``) holds its neighbours'
traces too. ``report --step 2`` for a page, Perfetto or ``--from-spans`` must fetch step 2's traces only (counted
at the client: every search's answer), print what it reads and how far it got (after 2 s; here at once), and show
exactly what the old read of the whole window showed (``--from-spans --json`` and the Perfetto file equal byte for
byte with the HTTP fallback, which still reads the window whole). A gRPC port that belongs to another Jaeger is
never read: the window is then read over HTTP.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import decode_resource_spans
from otel_agentloop.analysis._reading import _jaeger
from otel_agentloop.cli import main
from tests._support.jaeger_runs import run_env, wait_stored

from .conftest import stack_mod

STEPS, PROMPTS, ROLLOUTS = 3, 8, 2
SAMPLES = PROMPTS * ROLLOUTS
"""Samples per step."""


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    stack = stack_mod.prepare(stack_mod.free_ports_query_paired(), log_dir=tmp_path_factory.mktemp("jaeger-logs"))
    try:
        stack.start_process("jaeger")
    except stack_mod.StackError as exc:
        stack.stop()
        pytest.fail(f"cannot run Jaeger: {exc}", pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def job(jaeger: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three steps of ``SAMPLES`` samples each, seconds apart, through Jaeger's own OTLP port; the service."""
    tag = uuid.uuid4().hex[:6]
    service = f"steptraces-{tag}"
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "simulate", "--workers", "0", "--steps", str(STEPS), "--prompts",
         str(PROMPTS), "--rollout-n", str(ROLLOUTS), "--time-scale", "0.03", "--val-every", "0", "--quiet",
         "--endpoint", f"http://127.0.0.1:{jaeger.ports['jaeger_otlp_grpc']}", "--service-name", service],
        cwd=tmp_path_factory.mktemp("job"), env=run_env(f"run-{tag}"), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    wait_stored(jaeger, service, STEPS * SAMPLES, STEPS)
    return service


class Fetched:
    """Every search answer the report got: the steps (and runs) of the sample spans in them, the searches, and
    what happened in order (``events``: ``grpc sent``, ``grpc read``, ``grpc dropped`` (read to its end unread),
    ``http``)."""

    def __init__(self) -> None:
        self.samples: dict[int, set[tuple[int, int]]] = {}
        self.runs: dict[tuple[str, int], int] = {}
        self.searches = 0
        self.events: list[str] = []

    def add(self, resource_spans: list[Any]) -> None:
        self.searches += 1
        for rec in decode_resource_spans(resource_spans):
            if rec.name == sc.SAMPLE_SPAN:
                step = int(rec.attributes[sc.RL_STEP])
                self.samples.setdefault(step, set()).add((rec.trace_id, rec.span_id))
                run = (str(rec.resource.get(sc.RL_RUN_ID)), step)
                self.runs[run] = self.runs.get(run, 0) + 1

    def count(self) -> dict[int, int]:
        return {step: len(keys) for step, keys in sorted(self.samples.items())}


def _report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], jaeger: Any, service: str, *args: str
) -> tuple[int, str, str, Fetched]:
    """``report`` in this process, every trace search's answer counted (HTTP, and gRPC where it is read), every
    progress line printed."""
    fetched = Fetched()
    http = _jaeger.JaegerClient.find_traces

    def counted_http(self: Any, *a: Any, **k: Any) -> list[Any]:
        fetched.events.append("http")
        page = http(self, *a, **k)
        if k.get("operation") is None:  # the step's searches (not the summaries', nor engine load's)
            fetched.add(page)
        return page

    monkeypatch.setattr(_jaeger.JaegerClient, "find_traces", counted_http)
    try:
        from otel_agentloop.analysis._reading import _jaeger_grpc
    except ImportError:  # the code before gRPC searches: HTTP only
        pass
    else:
        # every answer read (collect: a search sent before, or find_traces' own; before that, find_traces)
        name = "collect" if hasattr(_jaeger_grpc.GrpcQuery, "collect") else "find_traces"
        grpc_read = getattr(_jaeger_grpc.GrpcQuery, name)

        def counted_grpc(self: Any, *a: Any, **k: Any) -> list[Any]:
            page = grpc_read(self, *a, **k)
            fetched.events.append("grpc read")
            fetched.add(page)
            return page

        monkeypatch.setattr(_jaeger_grpc.GrpcQuery, name, counted_grpc)
        if hasattr(_jaeger_grpc.GrpcQuery, "start"):
            grpc_start, grpc_drain = _jaeger_grpc.GrpcQuery.start, _jaeger_grpc.Started.drain

            def sent(self: Any, *a: Any, **k: Any) -> Any:
                fetched.events.append("grpc sent")
                return grpc_start(self, *a, **k)

            def dropped(self: Any) -> None:
                fetched.events.append("grpc dropped")
                grpc_drain(self)

            monkeypatch.setattr(_jaeger_grpc.GrpcQuery, "start", sent)
            monkeypatch.setattr(_jaeger_grpc.Started, "drain", dropped)
    try:
        from otel_agentloop.analysis._reading import _jaeger_step
    except ImportError:  # the code before progress lines
        pass
    else:  # every progress line, however quick the read (they start after 2 s)
        monkeypatch.setattr(_jaeger_step, "PROGRESS_EVERY_S", 0.0)
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    code = main(["report", "--jaeger", jaeger.jaeger_url, "--service", service, *args])
    out, err = capsys.readouterr()
    monkeypatch.undo()
    return code, out, err, fetched


def test_a_step_page_reads_only_that_steps_traces(jaeger, job, tmp_path, monkeypatch, capsys) -> None:
    perfetto = tmp_path / "step2.json"
    code, out, err, fetched = _report(
        monkeypatch, capsys, jaeger, job, "--step", "2", "--from-spans", "--json", "--perfetto", str(perfetto)
    )
    assert code == 0, err
    assert json.loads(out)["metrics"]["agent_loop/num_samples"] == SAMPLES
    # only step 2's sample traces came back, each once, in one search: none of its neighbours'
    assert fetched.count() == {2: SAMPLES}, (fetched.count(), err)
    assert fetched.searches == 1, err
    # the step's search was sent first, and Jaeger read it while the run's summaries were searched (over HTTP)
    assert fetched.events[0] == "grpc sent", fetched.events
    assert "http" in fetched.events[: fetched.events.index("grpc read")], fetched.events
    assert fetched.events.count("grpc sent") == 1 and "grpc dropped" not in fetched.events, fetched.events
    lines = [line for line in err.splitlines() if line.startswith("report: step 2")]
    assert lines[0] == (
        f"report: step 2: reading its traces only, by rl.step=2 over Jaeger's gRPC query API "
        f"(127.0.0.1:{jaeger.ports['query_grpc']}); its summary counts {SAMPLES} samples"
    ), err
    assert lines[-1].startswith(f"report: step 2: {SAMPLES + 2} traces read in ") and lines[-1].endswith(
        " s (1 search)"
    ), err  # the samples, the step's rl.step span and its summary

    # the same answer and the same Perfetto file from the whole window over HTTP (as before), which reads the
    # neighbouring steps too
    from otel_agentloop.analysis._reading import _jaeger_grpc

    monkeypatch.setattr(_jaeger_grpc.GrpcQuery, "services", lambda self: None)
    whole = tmp_path / "whole.json"
    code2, out2, err2, fetched2 = _report(
        monkeypatch, capsys, jaeger, job, "--step", "2", "--from-spans", "--json", "--perfetto", str(whole)
    )
    assert code2 == 0, err2
    assert out2 == out
    assert whole.read_bytes() == perfetto.read_bytes()
    assert fetched2.count() == {1: SAMPLES, 2: SAMPLES, 3: SAMPLES}, fetched2.count()
    assert "does not answer beside" in err2 and "a step's window is read whole over HTTP" in err2, err2


def test_the_search_sent_first_holds_every_runs_step_and_the_report_keeps_its_run(
    jaeger, tmp_path, monkeypatch, capsys
) -> None:
    """Two runs of one service, the second a few seconds after the first (their step windows apart: the slack is
    cut to 1 s here), both with a step 1. The step's search is sent before the run is known, so its answer holds
    both runs' step 1; the report keeps the latest run's, in one search, and prints exactly what the step's
    window read over HTTP prints."""
    from otel_agentloop.analysis._reading import _jaeger_grpc, _source

    tag = uuid.uuid4().hex[:6]
    service, first, second = f"tworuns-{tag}", f"first-{tag}", f"second-{tag}"
    for run, steps in ((first, 2), (second, 1)):
        out = subprocess.run(
            [sys.executable, "-m", "otel_agentloop", "simulate", "--workers", "0", "--steps", str(steps),
             "--prompts", str(PROMPTS), "--rollout-n", str(ROLLOUTS), "--time-scale", "0.03", "--val-every", "0",
             "--quiet", "--endpoint", f"http://127.0.0.1:{jaeger.ports['jaeger_otlp_grpc']}", "--service-name",
             service],
            cwd=tmp_path, env=run_env(run), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        time.sleep(3)  # the next run starts more than the (cut) slack later
    wait_stored(jaeger, service, 3 * SAMPLES, 3)

    def read(*args: str) -> tuple[str, Fetched]:
        monkeypatch.setattr(_source, "STEP_WINDOW_SLACK", timedelta(seconds=1))
        code, out, err, fetched = _report(monkeypatch, capsys, jaeger, service, *args, "--from-spans", "--json")
        assert code == 0, err
        assert json.loads(out)["metrics"]["agent_loop/num_samples"] == SAMPLES, out
        return out, fetched

    out, latest = read("--step", "1")  # the second run's (the latest); the first run has a step 1 too
    assert latest.runs == {(first, 1): SAMPLES, (second, 1): SAMPLES}, (latest.runs, latest.events)
    assert latest.events[0] == "grpc sent" and latest.events.count("grpc read") == 1, latest.events

    monkeypatch.setattr(_jaeger_grpc.GrpcQuery, "services", lambda self: None)  # the step's window over HTTP
    window_out, window = read("--step", "1")
    assert window_out == out
    assert window.runs == {(second, 1): SAMPLES}, window.runs  # the first run's step 1 lies outside its window


def test_a_search_no_read_took_is_read_to_its_end(jaeger, job) -> None:
    """A step's search sent and never read (a report that failed before its step read) is read to its end when
    the source closes (its call ends OK), never cut (CANCELLED): Jaeger 2.13 to 2.15 crash when a client stops
    reading an answer while Jaeger sends it (measured here: 8,192 traces cut 1.5 s in). Jaeger answers after."""
    import grpc

    from otel_agentloop.analysis import JaegerClient
    from otel_agentloop.analysis._reading._source import JaegerSource

    source = JaegerSource(JaegerClient(jaeger.jaeger_url), [job], "--service", None, 500)
    source.start_step(2)
    sent = [started.search.call for started in source.steps._started.values()]
    assert len(sent) == 1  # the module's Jaeger answers over gRPC
    source.close()
    assert sent[0].code() == grpc.StatusCode.OK
    assert job in JaegerClient(jaeger.jaeger_url).services()  # still running


def test_an_interrupted_step_read_reads_the_answer_to_its_end(jaeger, job) -> None:
    """Ctrl-C while a step's answer streams in: the rest of the answer is read (the call ends OK) before the
    interrupt goes on, so that closing the channel (the process ending) does not cut it under Jaeger."""
    import grpc

    from otel_agentloop.analysis._reading._jaeger import TraceQuery
    from otel_agentloop.analysis._reading._jaeger_grpc import GrpcQuery, grpc_target
    from otel_agentloop.analysis._reading._source import EPOCH

    query = GrpcQuery(grpc_target(jaeger.jaeger_url) or "", 10.0)
    started = query.start(TraceQuery(job, EPOCH, datetime.now(timezone.utc), {sc.RL_STEP: "2"}, search_depth=500))

    def interrupt(_traces: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        query.collect(started, interrupt)
    query.close()
    assert started.call.code() == grpc.StatusCode.OK


def test_compare_reads_each_steps_traces_only(jaeger, job, monkeypatch, capsys) -> None:
    code, _, err, fetched = _report(monkeypatch, capsys, jaeger, job, "--compare", "1", "3", "--json")
    assert code == 0, err
    assert fetched.count() == {1: SAMPLES, 3: SAMPLES}, fetched.count()
    assert fetched.searches == 2, err
    assert "report: step 1: reading its traces only" in err and "report: step 3: reading its traces only" in err


def test_another_jaegers_grpc_port_is_not_read(jaeger, job, stack, monkeypatch, capsys) -> None:
    """The port below the HTTP port answers, but as another Jaeger (other services): the window over HTTP."""
    from otel_agentloop.analysis._reading import _jaeger_step

    other = f"127.0.0.1:{stack.ports['query_grpc']}"  # the session's Jaeger (conftest), not this one
    monkeypatch.setattr(_jaeger_step, "grpc_target", lambda _url: other)
    code, out, err, fetched = _report(monkeypatch, capsys, jaeger, job, "--step", "2", "--from-spans", "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["agent_loop/num_samples"] == SAMPLES
    assert fetched.count() == {1: SAMPLES, 2: SAMPLES, 3: SAMPLES}, fetched.count()
    assert f"(at {other}): a step's window is read whole over HTTP" in err, err


def test_grpc_target_is_the_http_ports_neighbour() -> None:
    from otel_agentloop.analysis._reading._jaeger_grpc import grpc_target

    assert grpc_target("http://127.0.0.1:16686") == "127.0.0.1:16685"
    assert grpc_target("http://[::1]:16686/") == "[::1]:16685"
    assert grpc_target("http://jaeger.example") is None  # no port: a proxy, HTTP only
    assert grpc_target("https://jaeger.example:443") is None
