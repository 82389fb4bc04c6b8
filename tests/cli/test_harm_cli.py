"""The CLI against hostile trace data and a hostile environment (issue 21): no control character from trace data
reaches the terminal from either renderer, long strings are cut, rich markup in data is printed as written;
missing files, unwritable outputs, a broken Jaeger and out-of-range arguments are one line on stderr, never a
traceback; PNGs draw trace text literally (no mathtext). CLI checks run the real CLI in a subprocess; the
property tests run it in-process (hypothesis), with fixed hostile examples also as subprocesses."""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_agentloop.analysis import read_jsonl, render_png
from tests._support.otlp_lines import (
    HOSTILE,
    SGR,
    UNSAFE,
    assert_one_line_error,
    hung_snapshot,
    otlp_line,
    otlp_span,
    run_cli,
    run_main,
    sample_attrs,
    sample_spans,
)

NO_RICH = "import sys; sys.modules['rich'] = None; from otel_agentloop.cli import main; sys.exit(main(sys.argv[1:]))"


def _phase_file(path: Path, name: str, tool: str, error_type: str, phase: str) -> None:
    """Sample 0 with a generation named ``name``, a tool ``tool``, a failure ``error_type``; sample 1 hung in
    ``phase`` (a watchdog snapshot, no end)."""
    lines = [
        otlp_line(sample_spans(0, name=name, tool=tool, error_type=error_type, dur_ms=300)),
        otlp_line([hung_snapshot(1, phase)]),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")


REPORT = ["report", "--file", "t.jsonl", "--sample", "0", "--html", "p.html"]


def _unsafe_in(text: str) -> list[str]:
    return UNSAFE.findall(SGR.sub("", text))


def _render_in_process(
    tmp: Path, strings: tuple[str, str, str, str], rich: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    _phase_file(tmp / "t.jsonl", *strings)
    with monkeypatch.context() as m:
        m.setenv("FORCE_COLOR", "1")  # colour on a pipe: rich's own escapes are in the output
        m.delenv("NO_COLOR", raising=False)
        if not rich:
            m.setitem(sys.modules, "rich", None)  # type: ignore[arg-type]
            m.setitem(sys.modules, "rich.console", None)  # type: ignore[arg-type]
        args = [a if a not in ("t.jsonl", "p.html") else str(tmp / a) for a in REPORT]
        rc, out, err = run_main(args)
    assert rc == 0, err
    return out, err


data_text = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),  # every category of code point, controls included
        st.sampled_from(["\x1b", "\x9b", "\x9d", "\x07", "\u202e", "\u2028", "[", "]", "$", "\ud800"]),
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("rich", [True, False], ids=["rich", "plain"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strings=st.tuples(data_text, data_text, data_text, data_text))
def test_no_control_character_from_trace_data_reaches_the_terminal(
    rich: bool, strings: tuple[str, str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out, err = _render_in_process(Path(tmp), strings, rich, monkeypatch)
        reference, _ = _render_in_process(Path(tmp), ("x", "x", "x", "x"), rich, monkeypatch)
    assert not _unsafe_in(out) and not _unsafe_in(err), (_unsafe_in(out), _unsafe_in(err))
    # every escape sequence left is the renderer's own: as many as with harmless data, all of them colour codes
    assert out.count("\x1b") == reference.count("\x1b") == len(SGR.findall(out)), out
    assert "\x1b" not in err
    assert "hung samples" in out and "ERROR" in out


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("rich", [True, False], ids=["rich", "plain"])
def test_hostile_names_are_escaped_visibly_in_a_subprocess(tmp_path: Path, rich: bool) -> None:
    name, tool, error_type, phase = "".join(HOSTILE[:4]), "".join(HOSTILE[4:7]), "".join(HOSTILE[7:]), HOSTILE[0]
    _phase_file(tmp_path / "t.jsonl", name, tool, error_type, phase)
    argv = [sys.executable, "-m", "otel_agentloop"] if rich else [sys.executable, "-c", NO_RICH]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NO_COLOR"))}
    proc = subprocess.run(
        [*argv, *REPORT], cwd=tmp_path, env={**env, "FORCE_COLOR": "1"}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert not _unsafe_in(proc.stdout) and not _unsafe_in(proc.stderr)
    plain = SGR.sub("", proc.stdout)
    assert "\\x1b]0;pwned\\x07" in plain  # shown, escaped: the user sees what the data holds
    assert "\\x9b2J" in plain and "[bold red]markup[/]" in plain  # markup printed as written
    assert "\\u202egnp.exe" in plain and "\\ud800lone" in plain
    assert "hung samples" in plain and "(\\x1b]0;pwned\\x07, trace" in plain  # the hung sample's phase


@pytest.mark.e2e  # a subprocess
def test_a_2mb_error_type_is_printed_cut(tmp_path: Path) -> None:
    _phase_file(tmp_path / "t.jsonl", "gen", "search", "E" * 2_000_000, "tool_calls")
    proc = run_cli(REPORT, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) < 20_000
    line = next(line for line in proc.stdout.splitlines() if "ERROR EEE" in line)
    assert line.endswith("E…") and 100 < line.count("E") < 400


# -- clear errors, not tracebacks ---------------------------------------------------------------------------------
def _good(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(otlp_line(sample_spans(0)) + "\n")


@pytest.mark.e2e  # a subprocess
def test_a_missing_file_or_a_directory_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli(["report", "--file", "nope.jsonl"], tmp_path), "cannot read nope.jsonl", "No such")
    (tmp_path / "d").mkdir()
    # a folder is read as a trace directory: one without an index is not one
    assert_one_line_error(run_cli(["report", "--file", "d"], tmp_path), "cannot read d", "no index.jsonl")


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("flag", ["--html", "--png", "--timeline-png"])
def test_an_unwritable_output_path_is_one_line(tmp_path: Path, flag: str) -> None:
    _good(tmp_path)
    proc = run_cli(["report", "--file", "t.jsonl", flag, "no/such/dir/out"], tmp_path)
    assert_one_line_error(proc, f"cannot write {flag} no/such/dir/out", "No such file or directory")


class _Jaeger(http.server.BaseHTTPRequestHandler):
    """A loopback HTTP server answering every GET as ``server.mode`` says."""

    def do_GET(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "hangup":  # close without an answer
            self.close_connection = True
            return
        status, body = {
            "500": (500, b"internal error"),
            "404": (404, b'{"error": {"code": 404, "message": "trace not found"}}'),
            "html": (200, b"<html>not jaeger</html>"),
            "empty": (200, b""),
            "list": (200, b"[1, 2]"),
            "cut": (200, b'{"result": {"resourceSpans": ['),
        }[mode]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@contextlib.contextmanager
def _jaeger(mode: str) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Jaeger)
    server.mode = mode  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("500", "HTTP 500"),
        ("html", "not JSON"),
        ("empty", "empty answer"),
        ("list", "not a JSON object"),
        ("cut", "not JSON"),
        ("hangup", "RemoteDisconnected"),
    ],
)
def test_a_broken_jaeger_is_one_line(tmp_path: Path, mode: str, needle: str) -> None:
    with _jaeger(mode) as url:
        proc = run_cli(["report", "--jaeger", url, "--timeout", "5"], tmp_path)
    assert_one_line_error(proc, "cannot query Jaeger", needle)


@pytest.mark.e2e  # a subprocess
def test_an_unreachable_jaeger_is_one_line(tmp_path: Path) -> None:
    proc = run_cli(["report", "--jaeger", f"http://127.0.0.1:{_closed_port()}", "--timeout", "5"], tmp_path)
    assert_one_line_error(proc, "cannot query Jaeger", "refused")


@pytest.mark.e2e  # a subprocess
def test_a_jaeger_without_traces_is_one_line(tmp_path: Path) -> None:
    with _jaeger("404") as url:  # api_v3 answers an empty search with 404
        proc = run_cli(["report", "--jaeger", url], tmp_path)
    assert_one_line_error(proc, "no sample spans found")


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("url", ["file:///etc/passwd", "not a url"])
def test_a_jaeger_url_that_is_not_http_is_one_line(tmp_path: Path, url: str) -> None:
    assert_one_line_error(run_cli(["report", "--jaeger", url], tmp_path), "cannot query Jaeger", "not an http(s) URL")


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "--time-scale", "-1"], "argument --time-scale: '-1' is out of range (a finite number >= 0"),
        (["simulate", "--time-scale", "nan"], "argument --time-scale: 'nan' is out of range"),
        (["simulate", "--time-scale", "inf"], "argument --time-scale: 'inf' is out of range"),
        (["simulate", "--flush-timeout", "nan"], "argument --flush-timeout: 'nan' is out of range"),
        (["simulate", "--live-every", "0"], "argument --live-every: '0' is out of range"),
        (["simulate", "--steps", "0"], "argument --steps: 0 is out of range (an integer >= 1"),
        (["simulate", "--prompts", "many"], "argument --prompts: 'many' is not an integer"),
        (["simulate", "--png", "no/such/w.png"], "argument --png: 'no/such/w.png': no such folder 'no/such'"),
        (["simulate", "--file", "/"], "argument --file: '/' is a folder that is neither empty nor a trace folder"),
        (["simulate", "--file", "no/such/run.jsonl"], "argument --file: 'no/such/run.jsonl': no such folder"),
        (["report", "--since-minutes", "1e300", "--jaeger", "http://127.0.0.1:1"], "argument --since-minutes"),
        (["report", "--timeout", "-1", "--jaeger", "http://127.0.0.1:1"], "argument --timeout"),
    ],
)
def test_out_of_range_arguments_are_one_line_with_the_valid_range(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 2
    assert_one_line_error(proc, needle)


# -- PNGs draw trace text literally ----------------------------------------------------------------------------------
@pytest.mark.e2e  # a subprocess
def test_png_survives_mathtext_in_span_names(tmp_path: Path) -> None:
    _phase_file(tmp_path / "t.jsonl", r"$\foo$", r"$\frac{", "$", "tool_calls")
    proc = run_cli([*REPORT, "--png", "w.png", "--timeline-png", "t.png"], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for png in ("w.png", "t.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _label_left_edges(png: Path) -> list[int]:
    """The leftmost inked column of each y tick label (top to bottom) of a waterfall PNG."""
    import matplotlib.image as mpimg

    ink = np.asarray(mpimg.imread(png))[..., :3].min(axis=2) < 0.5
    columns = ink.mean(axis=0)
    spine = int(np.argmax(columns > 0.5))  # the axes' left spine: the first column inked over half the height
    rows = np.flatnonzero(ink[:, spine])
    top, bottom = int(rows.min()), int(rows.max()) - 20  # the x axis's "0" label hangs below the spine
    labels = ink[top:bottom, : spine - 12]  # left of the tick marks and their padding
    inked = np.flatnonzero(labels.any(axis=1))
    bands = np.split(inked, np.flatnonzero(np.diff(inked) > 3) + 1)
    return [int(np.flatnonzero(labels[band].any(axis=0)).min()) for band in bands if len(band)]


def test_png_draws_dollar_signs_as_written_not_as_italic_math(tmp_path: Path) -> None:
    a = sample_attrs(0)
    spans = [
        otlp_span("rl.sample", 1, end_ms=30, attrs=a),
        otlp_span("cost $5 or $6", 2, parent=1, end_ms=10, attrs=a),
        otlp_span("cost S5 or S6", 3, parent=1, start_ms=10, end_ms=20, attrs=a),
    ]
    (tmp_path / "t.jsonl").write_text(otlp_line(spans) + "\n")
    png = tmp_path / "w.png"
    render_png(list(read_jsonl(str(tmp_path / "t.jsonl"))), str(png))
    edges = _label_left_edges(png)
    assert len(edges) == 3, edges
    # monospace: drawn literally, the two labels of 13 characters start in the same column; as mathtext the $s
    # vanish and "5 or " is italic, so that label is narrower
    assert abs(edges[1] - edges[2]) <= 1, edges


@settings(max_examples=60, deadline=None)
@given(tool=data_text, phase=data_text)
def test_the_live_view_escapes_tool_names_and_phases(tool: str, phase: str) -> None:
    from rich.console import Console

    from otel_agentloop.analysis._rendering._display import inflight_lines, live_view
    from otel_agentloop.health import InflightSample

    running = [
        InflightSample(1, False, i, 0, p, t, 1.0, 2.0 + i, "ab" * 16, "cd" * 8, i == 0, None, 1)
        for i, (p, t) in enumerate([(phase, tool), ("tool_calls", tool), (phase, None)])
    ]
    lines = inflight_lines(running)
    assert not _unsafe_in("\n".join(lines))
    screen = io.StringIO()
    Console(file=screen, force_terminal=True, color_system="standard", markup=False, width=200).print(
        live_view("step 1", 1, 4, 3.0, lines)
    )
    assert not _unsafe_in(screen.getvalue())
    assert all(len(line) < 600 for line in lines)
