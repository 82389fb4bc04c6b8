"""The metrics processor's one hook interface (``StepHooks``), the one step key, and ``rl.*`` names only in semconv."""

from __future__ import annotations

import ast
import logging
import pathlib
from collections.abc import Mapping

import pytest

import otel_agentloop
from otel_agentloop import semconv as sc
from otel_agentloop.export._keep import SampleKeeper
from otel_agentloop.export._pipeline import RecordPipeline
from otel_agentloop.export._step_summary import StepSummaryWriter
from otel_agentloop.health._watchdog import LiveMonitor
from otel_agentloop.metrics import PhaseTable, StepMetrics
from otel_agentloop.metrics._hooks import StepHooks
from otel_agentloop.testing import capture
from tests._support.spans import Traced

PACKAGE = pathlib.Path(otel_agentloop.__file__).parent


class Recorder(StepHooks):
    """Appends ``(name, event, args)`` to a shared log; adds a counter and a metric key of its own."""

    def __init__(self, name: str, log: list[tuple[str, str, tuple[object, ...]]]) -> None:
        self.name, self.log = name, log

    def step_released(self, step: int | None, validate: bool) -> None:
        self.log.append((self.name, "step_released", (step, validate)))

    def telemetry_counters(self) -> Mapping[str, int]:
        self.log.append((self.name, "telemetry_counters", ()))
        return {f"{self.name}_count": 7}

    def step_metrics(self, step: int | None, validate: bool, metrics: StepMetrics) -> None:
        self.log.append((self.name, "step_metrics", (step, validate, metrics)))
        metrics[f"{self.name}/key"] = 1.5

    def step_collected(self, table: PhaseTable, metrics: StepMetrics, step: int | None, validate: bool) -> None:
        self.log.append((self.name, "step_collected", (table, metrics, step, validate)))

    def provider_flush(self, timeout_s: float) -> bool:
        self.log.append((self.name, "provider_flush", (timeout_s,)))
        return True

    def provider_shutdown(self) -> None:
        self.log.append((self.name, "provider_shutdown", ()))


class Raising(StepHooks):
    """Raises from every event."""

    def __init__(self) -> None:
        self.calls = 0

    def _raise(self) -> None:
        self.calls += 1
        raise RuntimeError("a broken hook")

    def step_released(self, step: int | None, validate: bool) -> None:
        self._raise()

    def telemetry_counters(self) -> Mapping[str, int]:
        self._raise()
        return {}

    def step_metrics(self, step: int | None, validate: bool, metrics: StepMetrics) -> None:
        self._raise()

    def step_collected(self, table: PhaseTable, metrics: StepMetrics, step: int | None, validate: bool) -> None:
        self._raise()

    def provider_flush(self, timeout_s: float) -> bool:
        self._raise()
        return True

    def provider_shutdown(self) -> None:
        self._raise()


def _run_step(step: int, samples: int, validate: bool = False) -> None:
    @otel_agentloop.phase(sc.GENERATE)
    def generate() -> None:
        return None

    with otel_agentloop.step(step, validate=validate):
        for i in range(samples):
            with otel_agentloop.sample(i):
                generate()


def test_each_hook_gets_each_event_once_in_order_with_its_arguments(traced: Traced) -> None:
    log: list[tuple[str, str, tuple[object, ...]]] = []
    metrics_processor = traced.handle.metrics
    metrics_processor.add_hooks(Recorder("a", log))
    metrics_processor.add_hooks(Recorder("b", log))
    _run_step(3, samples=2)

    result = metrics_processor.collect(3)

    assert [(name, event) for name, event, _ in log] == [
        ("a", "step_released"),
        ("b", "step_released"),
        ("a", "telemetry_counters"),
        ("b", "telemetry_counters"),
        ("a", "step_metrics"),
        ("b", "step_metrics"),
        ("a", "step_collected"),
        ("b", "step_collected"),
    ]
    assert log[0][2] == log[1][2] == (3, False)
    for _, _, args in log[4:6]:
        assert args[:2] == (3, False) and args[2] is result  # the dict collect() returns, filled in place
    for _, _, args in log[6:]:
        table, metrics, step, validate = args
        assert isinstance(table, PhaseTable) and len(table) == 2 and table.step_key == (3, False)
        assert metrics is result and (step, validate) == (3, False)
    assert result["agent_loop/telemetry/a_count"] == result["agent_loop/telemetry/b_count"] == 7.0
    assert result["a/key"] == result["b/key"] == 1.5
    assert result["agent_loop/num_samples"] == 2  # the collect itself is unchanged

    log.clear()
    metrics_processor.take(4, True, release=False)  # a peek releases nothing: no event
    assert log == []
    metrics_processor.take(4, True)  # a release without a collect: only the release event
    assert log == [("a", "step_released", (4, True)), ("b", "step_released", (4, True))]

    log.clear()
    assert traced.handle.force_flush(5)
    flushes = [(name, event) for name, event, _ in log]
    assert flushes == [("a", "provider_flush"), ("b", "provider_flush")]
    assert all(0 < args[0] <= 5 for _, _, args in log)  # type: ignore[operator]

    log.clear()
    traced.handle.shutdown(5)
    assert [(name, event) for name, event, _ in log] == [("a", "provider_shutdown"), ("b", "provider_shutdown")]


def test_a_raising_hook_stops_neither_the_others_nor_the_collect(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    log: list[tuple[str, str, tuple[object, ...]]] = []
    raising = Raising()
    metrics_processor = traced.handle.metrics
    metrics_processor.add_hooks(raising)
    metrics_processor.add_hooks(Recorder("after", log))
    _run_step(5, samples=3)

    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        result = metrics_processor.collect(5)
        result_again = metrics_processor.collect(5)

    assert raising.calls == 8  # four events, two collects: each called, each raised
    events = ["step_released", "telemetry_counters", "step_metrics", "step_collected"]
    assert [event for _, event, _ in log] == events * 2
    assert result["agent_loop/num_samples"] == 3 and result["after/key"] == 1.5
    assert result["agent_loop/telemetry/after_count"] == 7.0
    assert result["agent_loop/telemetry/spans_dropped"] == 0.0  # the handle's own counters still reported
    assert result_again["agent_loop/num_samples"] == 0
    assert traced.handle.summaries is not None and traced.handle.summaries.written == 2  # the summary hook ran
    errors = [r.getMessage() for r in caplog.records if "internal error" in r.getMessage()]
    assert sorted(errors) == sorted(  # logged once per event, not once per call
        f"otel_agentloop: internal error in PhaseMetricsProcessor.{event} (suppressed; training continues)"
        for event in events
    )

    log.clear()
    assert metrics_processor.force_flush(2000) is False  # a raising flush counts as not flushed
    assert [event for _, event, _ in log] == ["provider_flush"]
    metrics_processor.shutdown()
    assert [event for _, event, _ in log] == ["provider_flush", "provider_shutdown"]


def test_the_handle_registers_its_parts_as_hooks_in_the_order_they_had() -> None:
    """The export pipeline first, on both paths (a step is read only after its spans are accounted), keeper
    before the watchdog (a step's kept samples leave before its verdict), then the summary writer, then the
    handle's export counters."""
    with capture(fast_path=False) as plain:
        kinds = [type(h).__name__ for h in plain.handle.metrics._hooks]
        assert kinds == [RecordPipeline.__name__, LiveMonitor.__name__, StepSummaryWriter.__name__, "_ExportCounters"]
    with capture() as fast:
        kinds = [type(h).__name__ for h in fast.handle.metrics._hooks]
        assert kinds == [RecordPipeline.__name__, LiveMonitor.__name__, StepSummaryWriter.__name__, "_ExportCounters"]
    with capture(max_exported_samples_per_step=1) as budget:
        kinds = [type(h).__name__ for h in budget.handle.metrics._hooks]
        assert kinds == [
            RecordPipeline.__name__,
            SampleKeeper.__name__,
            LiveMonitor.__name__,
            StepSummaryWriter.__name__,
            "_ExportCounters",
        ]
        _run_step(1, samples=4)
        result = budget.handle.metrics.collect(1)
        assert result["agent_loop/telemetry/samples_not_kept"] == 0.0  # keep_slowest (5) kept the other 3
        assert budget.handle.keeper is not None and budget.handle.keeper.counters["kept_slowest"] == 3


@pytest.mark.parametrize(
    ("attributes", "key"),
    [
        ({sc.RL_STEP: 3, sc.RL_VALIDATE: True}, (3, True)),
        ({sc.RL_STEP: 3, sc.RL_VALIDATE: False}, (3, False)),
        ({sc.RL_STEP: 3}, (3, False)),
        ({}, (None, False)),
        ({sc.RL_VALIDATE: True}, (None, True)),
        ({sc.RL_STEP: True, sc.RL_VALIDATE: 1}, (None, False)),  # a bool is no step, 1 is not True
        ({sc.RL_STEP: "3", sc.RL_VALIDATE: "true"}, (None, False)),
        ({sc.RL_STEP: 3.0}, (None, False)),
    ],
)
def test_step_key_reads_one_meaning(attributes: dict[str, object], key: tuple[int | None, bool]) -> None:
    assert sc.step_key(attributes) == key


def _rl_literals(path: pathlib.Path) -> list[str]:
    """``"rl.`` string constants in ``path`` that are not docstrings (comments are not in the AST)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):  # module/class/function docstrings and attribute docstrings after them
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    docstrings.add(id(stmt.value))
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("rl.")
        and id(node) not in docstrings
    ]


def test_no_rl_name_is_spelled_outside_semconv() -> None:
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "semconv.py"]
    assert len(files) > 50
    assert [hit for path in files for hit in _rl_literals(path)] == []
    # the check finds what it looks for: semconv itself spells them
    assert len(_rl_literals(PACKAGE / "semconv.py")) > 40
