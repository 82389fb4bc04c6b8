"""``report``'s views take typed options (``analysis._reading._options``, ``cli._options``), not a command line:
the flags map onto them in one place (``cli._report_args.options_of``) with the defaults the options document,
each view runs from one table, and a view called with options built by hand prints what the command prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from otel_agentloop.analysis._reading._options import JaegerOptions, StepOptions
from otel_agentloop.analysis._reading._source import open_jaeger
from otel_agentloop.cli import build_parser, main
from otel_agentloop.cli._options import Mode, Outputs, ReportOptions, RunOptions
from otel_agentloop.cli._report import VIEWS, report
from otel_agentloop.cli._report_args import options_of
from otel_agentloop.config import _local_stack


def _options(*flags: str) -> ReportOptions:
    return options_of(build_parser().parse_args(["report", *flags]))


def test_the_flags_defaults_are_the_options_defaults() -> None:
    assert _options("--file", "t.jsonl") == ReportOptions("step", "t.jsonl")
    assert _options("--jaeger", "http://127.0.0.1:1") == ReportOptions("step", JaegerOptions("http://127.0.0.1:1"))
    o = _options("--file", "t.jsonl")
    assert (o.step, o.out, o.run, o.compare) == (StepOptions(), Outputs(), RunOptions(), None)


def test_each_flag_lands_on_its_option() -> None:
    o = _options(
        "--jaeger", "http://j:1", "--service", "svc", "--since", "2h", "--search-depth", "7", "--timeout", "3",
        "--opensearch", "http://o:2", "--opensearch-index", "x-*", "--step", "4", "--validate", "--run-id", "r",
        "--sample", "3", "--rollout", "1", "--top", "2", "--json", "--png", "w.png", "--jaeger-ui", "http://ui",
    )  # fmt: skip
    assert o.jaeger == JaegerOptions("http://j:1", "svc", 120.0, 7, 3.0, "http://o:2", "x-*")
    assert o.jaeger_url == "http://j:1" and o.file is None
    assert o.step == StepOptions(4, True, "r", 3, 1, 2, all_failed=True, spans=False)
    assert o.out == Outputs(as_json=True, png="w.png", jaeger_ui="http://ui")
    page = _options("--file", "t.jsonl", "--run", "--steps", "2:", "--step-pages", "3", "--html", "r.html")
    assert page.run == RunOptions((2, None), 3) and page.out.html == "r.html" and page.file == "t.jsonl"


@pytest.mark.parametrize(
    ("flags", "mode", "spans"),
    [
        (("--runs", "--run", "--compare", "1", "2"), "runs", True),
        (("--run", "--compare", "1", "2"), "run", True),
        (("--compare", "1", "2"), "compare", True),
        ((), "step", False),
        (("--from-spans",), "step", True),
        (("--html", "p.html"), "step", True),
        (("--perfetto", "p.json"), "step", True),
        (("--timeline-png", "t.png"), "step", True),
    ],
)
def test_the_mode_is_the_first_view_the_flags_ask_for(flags: tuple[str, ...], mode: Mode, spans: bool) -> None:
    o = _options("--file", "t.jsonl", *flags)
    assert (o.mode, o.step.spans) == (mode, spans)
    assert o.compare == ((1, 2) if "--compare" in flags else None)


def test_every_mode_has_one_view() -> None:
    assert set(VIEWS) == set(get_args(Mode))


def test_jaeger_without_a_url_reads_the_local_stack_and_tries_its_opensearch(monkeypatch: Any) -> None:
    monkeypatch.delenv("OTEL_AGENTLOOP_STACK", raising=False)
    o = _options("--jaeger", "--service", "svc")
    assert o.jaeger == JaegerOptions(_local_stack.jaeger_url(None), service="svc")
    assert o.jaeger is not None
    source = open_jaeger(o.jaeger, print)  # the service named: Jaeger is not asked yet
    assert source.index is not None and source.index.base_url == _local_stack.opensearch_url(None)
    assert not source.index_named


def test_a_view_called_with_options_prints_what_the_command_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cmd = [sys.executable, "-m", "otel_agentloop", "simulate", "--steps", "2", "--prompts", "4", "--rollout-n", "2"]
    cmd += ["--time-scale", "0", "--quiet", "--val-every", "0", "--file", str(tmp_path / "run.jsonl")]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = str(tmp_path / "run.jsonl")
    for options, flags in [
        (ReportOptions("step", path, StepOptions(1, top=3), out=Outputs(as_json=True)), ["--step", "1", "--top", "3"]),
        (ReportOptions("run", path, out=Outputs(as_json=True)), ["--run"]),
        (ReportOptions("runs", path), ["--runs"]),
        (
            ReportOptions("compare", path, StepOptions(spans=True), (1, 2), Outputs(as_json=True)),
            ["--compare", "1", "2"],
        ),
    ]:
        assert report(options) == 0
        by_hand = capsys.readouterr()
        json_flag = ["--json"] if options.out.as_json else []
        assert main(["report", "--file", path, *flags, *json_flag]) == 0
        assert capsys.readouterr() == by_hand
        if options.out.as_json:
            assert json.loads(by_hand.out)
