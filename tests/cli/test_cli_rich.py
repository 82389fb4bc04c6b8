"""The CLI's terminal output as a user sees it: rich tables, colour and live view when the ``cli`` extra is
installed, the plain renderer when it is not, colour only on a terminal and never with ``NO_COLOR``, and
``--json`` stdout that is JSON alone. Every run is the real CLI in a subprocess; terminals are real ptys."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

pytest.importorskip("rich")  # the cli extra; `make install` installs it

SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour / style codes
BOX = re.compile(r"[\u2500-\u257f]")  # box drawing: rich's table rules (the waterfall's bars are U+2588)
# the CLI with rich made unimportable: what a user without the cli extra gets
NO_RICH = "import sys; sys.modules['rich'] = None; from otel_agentloop.cli import main; sys.exit(main(sys.argv[1:]))"
SIM = ["simulate", "--steps", "2", "--prompts", "4", "--rollout-n", "2", "--time-scale", "0.05", "--val-every", "0"]


def _env(**extra: str) -> dict[str, str]:
    drop = ("OTEL_", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["TERM"] = "xterm-256color"
    env.update(extra)
    return env


def _argv(args: list[str], rich: bool) -> list[str]:
    return [sys.executable, "-m", "otel_agentloop", *args] if rich else [sys.executable, "-c", NO_RICH, *args]


def _pipe(cwd: Path, args: list[str], rich: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _argv(args, rich), cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=180, check=True
    )


def _pty(cwd: Path, args: list[str], *, on: str = "stdout", rich: bool = True, **env: str) -> tuple[str, str]:
    """Run with ``on`` (stdout or stderr) a pseudo-terminal and the other stream a file: (terminal, file)."""
    master, slave = pty.openpty()
    other = cwd / "other.txt"
    with other.open("w") as fh:
        streams = {"stdout": slave, "stderr": fh} if on == "stdout" else {"stdout": fh, "stderr": slave}
        proc = subprocess.Popen(_argv(args, rich), cwd=cwd, env=_env(**env), **streams)  # type: ignore[call-overload]
        os.close(slave)
        chunks = []
        try:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
        finally:
            os.close(master)
            rc = proc.wait(timeout=180)
    assert rc == 0, other.read_text()
    return b"".join(chunks).decode().replace("\r\n", "\n"), other.read_text()


def _tokens(text: str) -> list[list[str]]:
    """The words of each non-empty line, borders dropped: what must not differ between rich and plain."""
    lines = [BOX.sub(" ", SGR.sub("", line)).split() for line in text.splitlines()]
    return [words for words in lines if words]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short simulated run's trace file (run.jsonl) in its own directory."""
    cwd = tmp_path_factory.mktemp("rich")
    _pipe(cwd, [*SIM, "--json", "--quiet", "--file", "run.jsonl"])
    return cwd


REPORT = ["report", "--file", "run.jsonl"]


def test_piped_output_is_rich_tables_without_escape_codes(traces: Path) -> None:
    out = _pipe(traces, REPORT).stdout
    assert "\x1b" not in out
    assert "phase (s)" in out and "slowest samples" in out and "rl.sample" in out
    assert BOX.search(out)  # rendered by rich: a rule under each table header


def test_terminal_gets_colour_and_no_color_turns_it_off(traces: Path) -> None:
    screen, _ = _pty(traces, REPORT)
    assert SGR.search(screen) and BOX.search(screen)  # rich, coloured
    assert "\x1b[34m" in screen or "\x1b[94m" in screen  # generation bars in blue
    plain_screen, _ = _pty(traces, REPORT, NO_COLOR="1")
    assert BOX.search(plain_screen) and "\x1b" not in plain_screen  # still rich, no colour (no-color.org)
    assert _tokens(plain_screen) == _tokens(screen)
    empty, _ = _pty(traces, REPORT, NO_COLOR="")  # set but empty: not a request (no-color.org)
    assert SGR.search(empty)


def test_force_color_colours_a_pipe(traces: Path) -> None:
    forced = _pipe(traces, REPORT, FORCE_COLOR="1").stdout
    assert SGR.search(forced)
    assert _tokens(forced) == _tokens(_pipe(traces, REPORT).stdout)
    assert "\x1b" not in _pipe(traces, REPORT, FORCE_COLOR="1", NO_COLOR="1").stdout  # NO_COLOR wins


def test_json_stdout_is_json_alone_even_on_a_coloured_terminal(traces: Path) -> None:
    piped = _pipe(traces, [*REPORT, "--json"], FORCE_COLOR="1").stdout
    assert json.loads(piped)["step"] == 2 and "\x1b" not in piped
    screen, _ = _pty(traces, [*REPORT, "--json"])
    assert json.loads(screen) == json.loads(piped)
    sim, err = _pty(traces, [*SIM, "--json", "--file", "again.jsonl"])  # the live view goes to stderr
    assert [entry["step"] for entry in json.loads(sim)] == [1, 2] and "\x1b" not in sim
    assert "spans exported" in err


def test_without_rich_the_plain_renderer_prints_the_same_content(traces: Path) -> None:
    with_rich = _pipe(traces, REPORT).stdout
    plain = _pipe(traces, REPORT, rich=False).stdout
    assert not BOX.search(plain) and "\x1b" not in plain
    assert "phase (s)                 min     mean      p50" in plain  # today's fixed-width text
    assert _tokens(plain) == _tokens(with_rich)  # same titles, metric names, numbers, rows, order
    screen, _ = _pty(traces, REPORT, rich=False)
    assert "\x1b[34m" in screen and not BOX.search(screen)  # the plain waterfall still colours a terminal
    assert "\x1b" not in _pty(traces, REPORT, rich=False, NO_COLOR="1")[0]
    assert json.loads(_pipe(traces, [*REPORT, "--json"], rich=False).stdout) == json.loads(
        _pipe(traces, [*REPORT, "--json"]).stdout
    )


def test_live_progress_redraws_through_rich_on_a_terminal_and_plain_ansi_without_it(traces: Path) -> None:
    out_rich = traces / "sim_rich"
    out_rich.mkdir()
    screen, stdout = _pty(out_rich, SIM, on="stderr")
    assert "━" in screen and "8/8" in screen  # rich's progress bar, finished
    assert "\x1b[?25l" in screen and "\x1b[?25h" in screen  # rich.live hides the cursor, then shows it again
    assert "\x1b" not in stdout and "== step 2: agent_loop metrics" in stdout  # stdout is a file: plain
    out_plain = traces / "sim_plain"
    out_plain.mkdir()
    screen, stdout = _pty(out_plain, SIM, on="stderr", rich=False)
    assert "\x1b[J" in screen and "#" * 30 in screen and "8/8" in screen  # the plain bar, redrawn in place
    assert not BOX.search(stdout) and "== step 2: agent_loop metrics" in stdout
    screen, _ = _pty(out_rich, SIM, on="stderr", NO_COLOR="1")
    assert "━" in screen and "\x1b[2K" in screen and not SGR.search(screen)  # still live, no colour


def test_the_library_never_imports_rich(tmp_path: Path) -> None:
    code = (
        "import sys, otel_agentloop as oal\n"
        "h = oal.configure('t', file='t.jsonl', set_global=False)\n"
        "with oal.step(1):\n"
        "    with oal.sample(0, 0):\n"
        "        pass\n"
        "h.metrics.collect(1); h.shutdown()\n"
        "import otel_agentloop.cli\n"
        "print('rich' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


ERRORS = """
import otel_agentloop as oal
handle = oal.configure("rich-errors", file="err.jsonl")
@oal.trace_reward
def reward(i):
    if i == 1:
        raise ValueError("bad reward")
    return 1.0
with oal.step(1):
    for i in range(3):
        try:
            with oal.sample(i, 0):  # sample 1 fails: its reward's error ends its sample span with an error
                reward(i)
        except ValueError:
            pass
handle.metrics.collect(1)
handle.shutdown()
"""


def test_a_failed_sample_is_flagged_the_same_way_and_red_on_a_terminal(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", ERRORS], cwd=tmp_path, env=_env(), check=True, timeout=60)
    args = ["report", "--file", "err.jsonl", "--sample", "1"]
    with_rich, plain = _pipe(tmp_path, args).stdout, _pipe(tmp_path, args, rich=False).stdout
    assert _tokens(with_rich) == _tokens(plain)
    flagged = [words for words in _tokens(plain) if words[:3] == ["1", "/", "0"]]
    assert len(flagged) == 1 and flagged[0][-1] == "FAILED"  # its verdict (metrics._summary.verdict)
    screen, _ = _pty(tmp_path, args)
    row = next(line for line in screen.splitlines() if SGR.sub("", line).startswith("1 / 0"))
    assert re.search(r"\x1b\[(1;)?31m", row)  # the row is red
    assert "ERROR ValueError" in SGR.sub("", screen)  # the waterfall's failed span
