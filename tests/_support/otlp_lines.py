"""Trace data for the reader and CLI tests: OTLP-JSON lines as our file exporter writes them (samples, phase
spans, hung snapshots), the CLI run as a subprocess or in process, and hostile text that must never reach a terminal."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_agentloop import semconv as sc
from otel_agentloop.cli import main

SGR = re.compile(r"\x1b\[[0-9;]*m")
# what must never reach a terminal from data: C0 but newline, DEL, C1, bidi controls, line separators, surrogates
UNSAFE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)
HOSTILE = [
    "\x1b]0;pwned\x07",  # OSC: set the window title
    "\x1b]52;c;cHduZWQ=\x07",  # OSC 52: write the clipboard
    "\x1b[2J\x1b[H",  # clear the screen, cursor home
    "\x1b[31mred\x1b[0m",  # a data-borne colour
    "\x9b2J",  # C1 CSI
    "\x9d0;t\x9c",  # C1 OSC ... ST
    "\x07\x08\r\x0b\x0c\x7f",
    "safe\u202egnp.exe",  # bidi override
    "\u2066iso\u2069",
    "[bold red]markup[/]",
    "\ud800lone",  # a lone surrogate (os.fsdecode of a non-UTF-8 name)
]
T0 = 1_700_000_000_000_000_000  # Unix ns
MS = 1_000_000


# -- OTLP-JSON lines as our file exporter writes them -------------------------------------------------------------
def otlp_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": value}


def otlp_span(
    name: str,
    span_id: int,
    *,
    parent: int = 0,
    trace: int = 0xABC,
    start_ms: int = 0,
    end_ms: int = 10,
    attrs: Mapping[str, Any] | None = None,
    error: bool = False,
) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": format(trace, "032x"),
        "spanId": format(span_id, "016x"),
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(T0 + start_ms * MS),
        "endTimeUnixNano": str(T0 + end_ms * MS),
        "attributes": [{"key": k, "value": otlp_value(v)} for k, v in (attrs or {}).items()],
        "status": {"code": 2, "message": "failed"} if error else {},
    }
    if parent:
        span["parentSpanId"] = format(parent, "016x")
    return span


def otlp_line(spans: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                    "scopeSpans": [{"scope": {"name": "otel_agentloop"}, "spans": list(spans)}],
                }
            ]
        }
    )


def sample_attrs(index: int, step: int = 1, rollout: int = 0, **extra: Any) -> dict[str, Any]:
    return {sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: index, sc.RL_ROLLOUT_N: rollout, **extra}


def sample_spans(
    index: int,
    *,
    name: str = "text_completion sim",
    tool: str = "search",
    error_type: str = "ValueError",
    trace: int | None = None,
    dur_ms: int = 100,
) -> list[dict[str, Any]]:
    """A finished sample: its ``rl.sample`` span, a generation, a tool call and a failed reward."""
    trace = trace if trace is not None else 0x1000 + index
    base = (index + 1) << 8
    a = sample_attrs(index)
    return [
        otlp_span(sc.SAMPLE_SPAN, base, trace=trace, end_ms=dur_ms, attrs=a),
        otlp_span(name, base + 1, parent=base, trace=trace, end_ms=dur_ms // 2, attrs={**a, sc.RL_PHASE: sc.GENERATE}),
        otlp_span(
            f"execute_tool {tool}",
            base + 2,
            parent=base,
            trace=trace,
            start_ms=dur_ms // 2,
            end_ms=dur_ms * 3 // 4,
            attrs={**a, sc.RL_PHASE: sc.TOOL_CALLS, sc.GEN_AI_TOOL_NAME: tool},
        ),
        otlp_span(
            "reward",
            base + 3,
            parent=base,
            trace=trace,
            start_ms=dur_ms * 3 // 4,
            end_ms=dur_ms,
            attrs={**a, sc.RL_PHASE: sc.COMPUTE_SCORE, sc.ERROR_TYPE: error_type},
            error=True,
        ),
    ]


def hung_snapshot(index: int, phase: str) -> dict[str, Any]:
    """A watchdog snapshot of a sample that never ended, stuck in ``phase``."""
    attrs = sample_attrs(index, **{sc.RL_SNAPSHOT: True, sc.RL_PHASE: phase})
    return otlp_span(sc.SAMPLE_SPAN, 0xFFFF00 + index, trace=0x9000 + index, end_ms=500, attrs=attrs)


def run_cli(args: Sequence[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NO_COLOR", "FORCE_COLOR"))}
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_main(args: Sequence[str]) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr). An exception escaping it is a traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode not in (0, None), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
