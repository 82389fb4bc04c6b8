"""A differential property test (issue 26): generated programs of phases (sync and async decorated phases,
``oal.span`` blocks, inside ``oal.step``/``oal.sample``) that write user values of every OTel type and shape
(scalars, numpy scalars and ``numpy.str_``, homogeneous sequences, nested mappings and lists, huge strings,
bytes, ints beyond int64, invalid keys) through ``attributes=``, ``set_attribute`` and ``set_attributes``,
events with attributes and explicit timestamps, links (one with an invalid context), statuses and exceptions
(raised and recorded), under span limits set through ``OTEL_*`` variables, run once on the fast path and once
on the SDK path (``OTEL_AGENTLOOP_FAST_PATH``). What a user's exporter and span processor got, our OTLP-JSON
file, and a real loopback OTLP receiver (gRPC, and http/protobuf) got are compared field by field with
``tests/_support/fast_path_parity.py`` (ids by position, times by order, explicit event times as they are, dropped
counts included), except the random-trace-id flag and the step summary's timing and which sample was slowest.
A float event time, which a user's exporter gets as given on the SDK path only (docs/fast-path.md), has its own
test below."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import SpanContext, Status, StatusCode

import otel_agentloop as oal
from tests._support.fast_path_parity import WHICH_SLOWEST, compare_runs, mask_metrics, run_both

EXAMPLES = 50
"""Examples per protocol: each runs the program twice, in fresh configurations (~0.1 s each on 2 shared cores)."""


class UserError(RuntimeError):
    """The user's exception, raised out of a phase and caught by the program."""


# -- values ---------------------------------------------------------------------------------------------------
_ints = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_floats = st.floats(allow_nan=False)  # NaN != NaN: the comparison could not tell a difference from itself
_text = st.text(max_size=24)
_huge = st.sampled_from([120, 5000]).map(lambda n: "\u00e9" * n)  # past the length limits below
_scalars = st.one_of(_text, st.booleans(), _ints, _floats, _huge)
_numpy = st.one_of(
    st.integers(-1000, 1000).map(np.int64),
    _floats.map(np.float64),
    st.booleans().map(np.bool_),
    st.one_of(_text, _huge).map(np.str_),
)
_homogeneous = st.one_of(
    st.lists(st.one_of(_text, _huge), max_size=3),
    st.lists(st.booleans(), max_size=3),
    st.lists(_ints, max_size=3),
    st.lists(_floats, max_size=3),
).flatmap(lambda xs: st.sampled_from([xs, tuple(xs)]))
_nested = st.recursive(
    st.one_of(_scalars, _numpy),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(_text, st.just("")), inner, max_size=3),
    ),
    max_leaves=6,
)
VALUES = st.one_of(
    _scalars,
    _numpy,
    _homogeneous,
    _nested,
    st.just(None),
    st.binary(max_size=8),
    st.integers(min_value=1 << 63, max_value=1 << 70),  # beyond int64: the encoders drop the key
)
KEYS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(["k", "user.key", "rl.note", "k2", "a" * 40]),
    st.sampled_from(["", 5, None]),  # invalid keys: dropped by the SDK
)
ATTRIBUTES = st.dictionaries(KEYS, VALUES, max_size=4)


# -- programs -------------------------------------------------------------------------------------------------
@dataclass
class Action:
    """One thing a phase's body does to ``trace.get_current_span()``."""

    kind: str  # "attr", "attrs", "event", "link", "status", "record_exception", "name"
    key: Any = None
    value: Any = None
    attributes: Any = None
    timestamp: float | None = None


@dataclass
class Phase:
    how: str  # "sync", "async" (decorated), "span" (an ``oal.span`` block)
    phase: str
    attributes: dict[Any, Any] | None
    actions: list[Action]
    raises: type[UserError] | None


@dataclass
class Program:
    env: dict[str, str]
    step_attributes: dict[Any, Any] | None
    samples: list[tuple[dict[Any, Any] | None, list[Phase]]] = field(default_factory=list)


_actions = st.one_of(
    st.builds(Action, st.just("attr"), key=KEYS, value=VALUES),
    st.builds(Action, st.just("attrs"), attributes=ATTRIBUTES),
    st.builds(
        Action,
        st.just("event"),
        key=st.sampled_from(["tick", "token", ""]),
        attributes=st.one_of(st.none(), ATTRIBUTES),
        timestamp=st.one_of(st.none(), st.integers(1, 1 << 40)),  # a float: test_a_float_event_time_...
    ),
    st.builds(
        Action,
        st.just("link"),
        value=st.sampled_from([(0xA1, 0xB1, False), (0xA2, 0xB2, True), (0, 0, False)]),  # (0, 0): invalid
        attributes=st.one_of(st.none(), ATTRIBUTES),
    ),
    st.builds(Action, st.just("status"), value=st.sampled_from([StatusCode.OK, StatusCode.ERROR]), key=_text),
    st.builds(
        Action,
        st.just("record_exception"),
        value=st.just(UserError),
        attributes=st.one_of(st.none(), ATTRIBUTES),
    ),
    st.builds(Action, st.just("name"), key=st.one_of(_text, _huge)),
)
_phases = st.builds(
    Phase,
    how=st.sampled_from(["sync", "async", "span"]),
    phase=st.sampled_from(["generate", "tool", "reward"]),
    attributes=st.one_of(st.none(), ATTRIBUTES),
    actions=st.lists(_actions, max_size=5),
    raises=st.sampled_from([None, UserError]),
)
_limits = st.fixed_dictionaries(
    {},
    optional={
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": st.sampled_from(["16", "100"]),
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": st.sampled_from(["10", "14"]),
        "OTEL_SPAN_EVENT_COUNT_LIMIT": st.sampled_from(["1", "3"]),
        "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": st.just("1"),
        "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": st.just("1"),
        "OTEL_SPAN_LINK_COUNT_LIMIT": st.just("1"),
    },
)
PROGRAMS = st.builds(
    Program,
    env=_limits,
    step_attributes=st.one_of(st.none(), ATTRIBUTES),
    samples=st.lists(st.tuples(st.one_of(st.none(), ATTRIBUTES), st.lists(_phases, max_size=3)), max_size=2),
)


# -- running a program ----------------------------------------------------------------------------------------
def _act(action: Action) -> None:
    span = trace.get_current_span()
    if action.kind == "attr":
        span.set_attribute(action.key, action.value)
    elif action.kind == "attrs":
        span.set_attributes(action.attributes)
    elif action.kind == "event":
        span.add_event(action.key, action.attributes, action.timestamp)
    elif action.kind == "link":
        trace_id, span_id, remote = action.value
        span.add_link(SpanContext(trace_id, span_id, is_remote=remote), action.attributes)
    elif action.kind == "status":
        span.set_status(Status(action.value, action.key if action.value is StatusCode.ERROR else None))
    elif action.kind == "name":
        span.update_name(action.key)
    else:
        span.record_exception(action.value("recorded"), action.attributes)


def _body(phase: Phase) -> None:
    for action in phase.actions:
        _act(action)
    if phase.raises is not None:
        raise phase.raises("raised")


def _call(phase: Phase) -> None:
    """One phase, as its kind runs it; the user's exception is caught here, as the user's code would."""
    options: dict[str, Any] = {"attributes": phase.attributes}
    if phase.phase == "tool":
        options["tool"] = "search"
    try:
        if phase.how == "span":
            with oal.span(phase.phase, **options):
                _body(phase)
        elif phase.how == "sync":
            oal.phase(phase.phase, **options)(_body)(phase)
        else:

            async def body(p: Phase) -> None:
                await asyncio.sleep(0)
                _body(p)

            asyncio.run(oal.phase(phase.phase, **options)(body)(phase))
    except UserError:
        pass


def _scenario(program: Program) -> Callable[[Any], Any]:
    def scenario(handle: Any) -> Any:
        with oal.step(1, attributes=program.step_attributes):
            for index, (attributes, phases) in enumerate(program.samples):
                with oal.sample(index, attributes=attributes):
                    for phase in phases:
                        _call(phase)
        return handle.metrics.collect(1)

    return scenario


def _check(program: Program, protocol: str, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        runs = run_both(_scenario(program), tmp_path, monkeypatch, env=program.env, protocol=protocol)
    compare_runs(runs, masked=[WHICH_SLOWEST])  # samples that take about the same time: either may be slowest
    assert mask_metrics(runs["fast"].result, True) == mask_metrics(runs["sdk"].result, True)


@pytest.mark.slow  # EXAMPLES programs, each run on both paths: 7-12 s per protocol at load 7
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=PROGRAMS)
def test_fast_and_sdk_paths_export_the_same_spans(
    program: Program, protocol: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(program, protocol, tmp_path_factory.mktemp("differential"))


def test_an_identity_value_cut_by_the_length_limit_stays_in_place(tmp_path: Path) -> None:
    """Found by the property test: with ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT=16`` (``rl.phase`` cut to
    ``generate_sequenc``) and an invalid key dropped, the SDK path wrote the identity back as if changed, moving
    ``rl.phase`` last; the fast path kept it in place."""
    dropped_key = [Action("attr", "k", ""), Action("attr", "", None)]
    program = Program(
        {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "16"},
        None,
        [(None, [Phase("sync", "generate", None, [], None), Phase("sync", "generate", None, dropped_key, None)])],
    )
    _check(program, "grpc", tmp_path)


def test_a_float_event_time_is_nanoseconds_on_the_wire_on_both_paths(tmp_path: Path) -> None:
    """``add_event(timestamp=1.5)``: read as 1 ns by every encoder on both paths; a user's exporter gets the
    SDK's span as the SDK stored it (1.5) and the fast path's with the converted time (docs/fast-path.md)."""
    program = Program({}, None, [(None, [Phase("sync", "tool", None, [Action("event", "tick", timestamp=1.5)], None)])])
    with pytest.MonkeyPatch.context() as monkeypatch:
        runs = run_both(_scenario(program), tmp_path, monkeypatch, protocol="http/protobuf")
    times = {
        (mode, source): [s["event_times"] for s in run.canonical(source) if s["name"] == "execute_tool search"]
        for mode, run in runs.items()
        for source in ("exporter", "file", "grpc")
    }
    assert times == {
        ("fast", "exporter"): [[1]],
        ("fast", "file"): [[1]],
        ("fast", "grpc"): [[1]],
        ("sdk", "exporter"): [[1.5]],
        ("sdk", "file"): [[1]],
        ("sdk", "grpc"): [[1]],
    }
    compare_runs(runs, ignore=["random_trace_id", "event_times"])


def test_a_link_with_an_invalid_context_and_only_invalid_keys(tmp_path: Path) -> None:
    link = Action("link", value=(0, 0, False), attributes={"": None})
    program = Program({}, None, [(None, [Phase("sync", "generate", None, [link], None)])])
    _check(program, "grpc", tmp_path)


def test_a_difference_fails_the_comparison(tmp_path: Path) -> None:
    """The comparison can fail: an attribute set on the fast path only is reported."""
    program = Program({}, None, [(None, [Phase("sync", "tool", None, [Action("attr", "k", "v")], None)])])
    with pytest.MonkeyPatch.context() as monkeypatch:
        runs = run_both(_scenario(program), tmp_path, monkeypatch, protocol="http/protobuf")
    compare_runs(runs)
    runs["fast"].grpc[0].resource_spans[0].scope_spans[0].spans[0].attributes.add(key="only.fast")
    with pytest.raises(AssertionError, match=r"only\.fast"):
        compare_runs(runs)
