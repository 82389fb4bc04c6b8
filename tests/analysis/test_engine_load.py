"""Issue 36: the engine's state under each turn read back (metrics, causes) and the engine's load over time
(``rl.engine.load`` spans) stored with the traces, found for a step, and drawn (step page, Perfetto, run page).

Spans are written through the public API by a real configured handle writing a real trace folder: generation turns
that set the engine integration's attributes (DESIGN-36's names) on the current span, and ``rl.engine.load`` root
spans made with the handle's tracer provider, as the engine integration makes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import Skipped, build_step_view
from otel_agentloop.analysis._reading._engine_load import step_engine_load
from otel_agentloop.analysis._reading._report import stored_summaries, summary_of
from otel_agentloop.analysis._reading._store import read_everything, read_index, read_steps
from otel_agentloop.analysis._rendering._perfetto import step_trace
from otel_agentloop.analysis._rendering._timeline_html import page_data
from otel_agentloop.metrics._causes import StepEngine, cause
from otel_agentloop.metrics._table import EngineSample
from tests._support.browser import open_page, severe_console
from tests._support.engine_steps import LOADED, STEP1, Turn, run_steps
from tests._support.trace_event_format import parse

P = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}"


def test_engine_state_metrics_are_exact_live_and_in_report(tmp_path, monkeypatch) -> None:
    """``collect()`` gives DESIGN-36's per-step engine figures from the turns' attributes, a report rebuilds the same
    from the trace folder, and the step summary stores them (what the run page reads)."""
    path = tmp_path / "traces"
    collected = run_steps(path, {1: STEP1, 2: [[Turn()], [Turn()]]}, monkeypatch)
    m = collected[1]
    means = [60.0] * 9
    means[5] = 240.0  # the crowded turn (the ninth turn, PREEMPTED having two)
    assert m[f"{P}/{sc.ENGINE_KV_CACHE_USAGE}/max"] == 0.97
    assert m[f"{P}/{sc.ENGINE_BATCH_RUNNING}/mean"] == pytest.approx(float(np.mean(means)))
    assert m[f"{P}/{sc.ENGINE_BATCH_RUNNING}/max"] == 64.0
    assert m[f"{P}/{sc.ENGINE_PREEMPTIONS}"] == 2.0
    assert m[f"{P}/{sc.ENGINE_CACHED_TOKENS}"] == 1500.0 * 8
    assert m[f"{P}/{sc.ENGINE_SEGMENTS}/max"] == 3.0
    assert not [k for k in collected[2] if "/engine/" in k]  # turns without the engine's facts: none of ours
    records = list(read_everything(str(path), Skipped(), lambda _: None))
    rebuilt = summary_of(records, 1)
    assert {k: v for k, v in rebuilt.metrics.items() if k.startswith(P)} == {
        k: v for k, v in m.items() if k.startswith(P)
    }
    stored = stored_summaries(records)[(1, False)]
    assert stored.metrics[f"{P}/{sc.ENGINE_KV_CACHE_USAGE}/max"] == 0.97
    assert stored.metrics[f"{P}/{sc.ENGINE_PREEMPTIONS}"] == 2.0


@pytest.mark.e2e  # a subprocess
def test_causes_read_from_the_engine_state(tmp_path, monkeypatch) -> None:
    """Each slow sample's cause names the engine's state behind it, the same in ``report --json`` (from the trace
    folder) as in the step summary ``collect()`` wrote."""
    path = tmp_path / "traces"
    run_steps(path, {1: STEP1}, monkeypatch)
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--step", "1", "--json", "--top", "8"],
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    causes = {row["sample_index"]: row["cause"] for row in json.loads(out.stdout)["slowest"]}
    assert causes[4] == "preempted 2 times at 97 % KV cache"
    assert causes[5] == "decoded 3.1x slower than the step's median while the engine ran 240 sequences (step median 60)"
    assert causes[6] == "no prefix-cache hit on 1,800 prompt tokens (turn median 1,500 cached)"
    assert causes[7] == "aborted by 2 weight syncs, resumed under policy 14 and 15"
    assert causes[0].startswith("generation ")
    stored = stored_summaries(list(read_everything(str(path), Skipped(), lambda _: None)))[(1, False)]
    assert {s.index: s.cause for s in stored.top} == causes
    plain = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--step", "1", "--from-spans"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert (
        "engine state: peak KV cache 97 %, 2 preemptions, 80 sequences running on average (max 64), 12,000 prompt "
        "tokens from the prefix cache, up to 3 attempts in a turn (partial rollouts)"
    ) in plain, plain


STEP = StepEngine(100.0, 200.0, 900.0, 1900.0, running_median=60.0, cached_median=1500.0)


def _sample(**over: object) -> EngineSample:
    base = EngineSample(turns=1, queue_s=0.0, output_tokens=200, decode_s=2.0, decoded_tokens=200)
    return base._replace(**over)


def test_cause_rules_in_order() -> None:
    gen = lambda e: cause(generate_s=10.0, tool_s=0.0, score_s=0.0, engine=e, step=STEP)  # noqa: E731
    assert gen(_sample(preemptions=1, kv_max=None)) == "preempted once"
    assert gen(_sample(aborts=1, policy_versions=(3,))) == "aborted once"  # no newer policy known
    assert gen(_sample(aborts=1, policy_versions=(3, 4))) == "aborted by 1 weight sync, resumed under policy 4"
    assert gen(_sample(aborts=3, policy_versions=(1, 2, 3, 4))) == (
        "aborted by 3 weight syncs, resumed under policy 2, 3 and 4"
    )
    # aborts first, then preemption, then the queue, whichever else holds
    both = _sample(aborts=1, policy_versions=(3, 4), preemptions=2, kv_max=0.9, queue_s=9.0)
    assert gen(both).startswith("aborted")
    assert gen(both._replace(aborts=0)) == "preempted 2 times at 90 % KV cache"
    assert gen(_sample(queue_s=9.0, running_mean=500.0)) == "waited 9.00 s in the engine queue"
    # a slow decode among as many sequences as usual: the speed, not the load
    slow = _sample(decode_s=8.0, running_mean=80.0)
    assert gen(slow) == "decoded 4.0 times slower than the step's median (25 vs 100 tokens/s)"
    assert gen(slow._replace(running_mean=90.0)).endswith("while the engine ran 90 sequences (step median 60)")
    # a prefix-cache miss only when the step's turns usually hit it
    assert gen(_sample(missed_prompt_tokens=50)).startswith("no prefix-cache hit on 50 prompt tokens")
    no_cache = STEP._replace(cached_median=0.0)
    assert cause(generate_s=10.0, tool_s=0.0, score_s=0.0, engine=_sample(missed_prompt_tokens=50), step=no_cache) == (
        "generation 10.00 s"
    )


# -- the engine's load over time: stored, found for a step, drawn ---------------------------------------------------
@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, float]]]:
    """A trace folder of two steps, each with two engines' load spans over its samples' time (engine 1's with
    ``rl.step``, engine 2's without, as a verl server actor writes), and in step 1 a span of step 2."""
    path = tmp_path_factory.mktemp("load") / "traces"
    with pytest.MonkeyPatch.context() as monkeypatch:
        collected = run_steps(path, LOADED, monkeypatch, loads=True)
    return path, collected


def _step_records(path: Path, step: int) -> list:
    return read_steps(str(path), None, [(step, False)], False, Skipped(), lambda _: None).records


def test_load_spans_land_with_their_step_or_by_their_time(loaded) -> None:
    """A load span with ``rl.step`` is in its step's file; one without is in a ``load-`` segment whose index line
    covers the 60 s its start falls in and a window's 60 s more; reading a step finds both, and the step's engines
    are exactly its own."""
    path, _ = loaded
    (run,) = read_index(str(path), lambda _: None)
    loads = [seg for seg in run.segments if seg.rel.split("/")[1].startswith("load-")]
    assert loads and all(seg.step is None and seg.until_ns - seg.opened_ns == 120 * 10**9 for seg in loads)
    for seg in loads:
        lines = (path / seg.rel).read_text().splitlines()
        assert lines and all(sc.ENGINE_LOAD_SPAN in line and sc.RL_ENGINE_ID in line for line in lines)
    step1 = (path / run.segments[0].rel).parent / "step-00000001.jsonl"
    assert step1.read_text().count(f'"{sc.ENGINE_LOAD_SPAN}"') == 1  # engine 1's of step 1 (step 2's: its file)
    for step in (1, 2):
        records = _step_records(path, step)
        view = build_step_view(records, step)
        assert [e.engine_id for e in view.engines] == ["host:1:0", "host:2:0"], step
        a, b = view.engines
        assert (a.running, a.waiting, a.kv_cache_usage, a.preemptions) == (
            (4, 8, 6),
            (0, 3, 1),
            (0.25, 0.97, 0.75),
            (0, 2, 0),
        )
        assert (b.running, b.preemptions) == ((2, 3), (0, 1))
        assert a.t_ns[1] - a.t_ns[0] == 100_000_000 and b.t_ns[1] - b.t_ns[0] == 300_000_000
        assert view.t0_ns <= a.t_ns[0] and a.t_ns[-1] <= view.t1_ns
        assert a.peak_kv_cache_usage == 0.97 and a.total_preemptions == 2
        # engine 2's span of the other step, by its time, is not this step's
        assert len([r for r in records if r.name == sc.ENGINE_LOAD_SPAN]) >= 2


def test_load_spans_change_no_metric(loaded) -> None:
    """The load spans are not samples: a report from the folder gives exactly the metrics ``collect()`` gave."""
    path, collected = loaded
    for step in (1, 2):
        rebuilt = summary_of(_step_records(path, step), step)
        live = {k: v for k, v in collected[step].items() if "/telemetry/" not in k}  # the live pipeline's own
        assert dict(rebuilt.metrics) == live


def test_load_clipped_and_merged_for_drawing() -> None:
    """Points outside the step's time are left out; a series longer than MAX_POINTS is merged into buckets (max of
    running/waiting/KV, sum of preemptions); a malformed span is left out whole."""
    from otel_agentloop.analysis._reading import _engine_load as el
    from otel_agentloop.metrics import SpanRecord

    n = el.MAX_POINTS * 2
    attrs = {
        sc.RL_ENGINE_ID: "e",
        sc.RL_ENGINE_LOAD_OFFSET_MS: list(range(0, n * 100, 100)),
        sc.RL_ENGINE_LOAD_RUNNING: [i % 7 for i in range(n)],
        sc.RL_ENGINE_LOAD_WAITING: [0] * n,
        sc.RL_ENGINE_LOAD_KV_CACHE_USAGE: [0.5] * n,
        sc.RL_ENGINE_LOAD_PREEMPTIONS: [1] * n,
    }
    rec = SpanRecord(1, 1, 0, sc.ENGINE_LOAD_SPAN, 10**12, 10**12 + n * 10**8, attrs)
    (e,) = step_engine_load([rec], 1, False, 0, 2 * 10**12 + n * 10**8)
    assert len(e.t_ns) == el.MAX_POINTS and e.total_preemptions == n and max(e.running) == 6
    (clipped,) = step_engine_load([rec], 1, False, 10**12 + 10**8, 10**12 + 3 * 10**8)
    assert clipped.t_ns == (10**12 + 10**8, 10**12 + 2 * 10**8, 10**12 + 3 * 10**8)
    texted = {k: json.dumps(v) if isinstance(v, list) else v for k, v in attrs.items()}  # as Jaeger returns them
    assert step_engine_load(
        [SpanRecord(1, 1, 0, sc.ENGINE_LOAD_SPAN, rec.start_ns, rec.end_ns, texted)],
        1,
        False,
        0,
        2 * 10**12 + n * 10**8,
    ) == [e]
    broken = SpanRecord(1, 2, 0, sc.ENGINE_LOAD_SPAN, 10**12, 10**12, {**attrs, sc.RL_ENGINE_LOAD_WAITING: [0]})
    assert step_engine_load([broken], 1, False, 0, 2 * 10**12) == []
    assert step_engine_load([rec], 2, False, 10**13, 10**14) == []  # no overlap


def test_step_page_data_and_perfetto_counter_tracks(loaded) -> None:
    path, _ = loaded
    records = _step_records(path, 1)
    view = build_step_view(records, 1)
    data = page_data(view)
    assert [g["engine"] for g in data["engines"]] == ["host:1:0", "host:2:0"]
    g = data["engines"][0]
    assert g["running"] == [4, 8, 6] and g["kv"] == [0.25, 0.97, 0.75] and g["preempted"] == [0, 2, 0]
    assert 0 <= g["t"][0] < g["t"][1] < g["t"][2] <= data["span_ms"] and g["t"][1] - g["t"][0] == pytest.approx(100)

    text = json.dumps(step_trace(records, 1), allow_nan=False)
    trace_ = parse(text)
    counters = [e for e in trace_.events if e["ph"] == "C"]
    by_pid: dict[int, list] = {}
    for e in counters:
        by_pid.setdefault(e["pid"], []).append(e)
    names = {trace_.process_names[pid]: events for pid, events in by_pid.items()}
    assert sorted(names) == ["engine host:1:0", "engine host:2:0"]
    one = names["engine host:1:0"]
    assert [e["args"]["running"] for e in one if e["name"] == "requests"] == [4, 8, 6]
    assert [e["args"]["kv"] for e in one if e["name"] == "KV cache usage %"] == [25.0, 97.0, 75.0]
    assert [e["args"]["preemptions"] for e in one if e["name"] == "preemptions"] == [0, 2, 0]
    assert trace_.other["engines"] == ["host:1:0", "host:2:0"]
    # not drawn as a span on any track
    assert not [e for e in trace_.events if e["ph"] == "X" and e["name"] == sc.ENGINE_LOAD_SPAN]


@pytest.mark.e2e  # a subprocess
def test_run_page_has_peak_kv_and_preemptions_per_step(loaded, tmp_path) -> None:
    path, _ = loaded
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--run", "--html", "run.html"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "run.html").read_text()
    raw = text.split('<script id="run-data" type="application/json">')[1].split("</script>")[0]
    data = json.loads(raw.replace("\\u003c", "<"))
    fields = data["fields"]
    rows = {r[fields.index("step")]: r for r in data["steps"]}
    assert rows[1][fields.index("kv_peak")] == 0.97 and rows[1][fields.index("preemptions")] == 2
    assert rows[2][fields.index("kv_peak")] == 0.5 and rows[2][fields.index("preemptions")] == 0
    # the step pages written with it draw the engines under the samples
    page = (tmp_path / "run.steps" / "step-1.html").read_text()
    assert '"engines":[{"engine":"host:1:0"' in page.replace(" ", "")


@pytest.mark.e2e  # a subprocess
def test_browser_draws_the_engines_under_the_samples_and_the_run_page_engine_panel(loaded, browser, tmp_path) -> None:
    """The step page draws one load row per engine under the samples, on their time axis (its plot spans the samples'
    track exactly), with its peak KV usage and preemptions; the run page shows the engine panel and column."""
    from selenium.webdriver.common.by import By

    path, _ = loaded
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--run", "--html", "run.html"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    open_page(browser, tmp_path / "run.steps" / "step-1.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#engines .eng-row")
    assert [r.get_attribute("data-engine") for r in rows] == ["host:1:0", "host:2:0"]
    assert "KV 97 % · 2 preempted" in rows[0].text and "KV 20 % · 1 preempted" in rows[1].text
    geometry = browser.execute_script(
        """var s = document.querySelector('#rows .row .track').getBoundingClientRect();
           var e = document.querySelector('#engines .eng-row .eng-plot').getBoundingClientRect();
           var r = document.querySelector('#rows').getBoundingClientRect();
           var c = Array.from(document.querySelectorAll('#engines canvas'));
           return [s.left, s.right, e.left, e.right, e.top >= r.bottom - 1,
                   c.map(function (x) { return [+x.getAttribute('data-points'), +x.getAttribute('data-preempted')]; }),
                   c.some(function (x) {  // something drawn: a pixel that is not blank
                     var d = x.getContext('2d').getImageData(0, 0, x.width, x.height).data;
                     for (var i = 3; i < d.length; i += 4) if (d[i]) return true; return false; })];"""
    )
    assert geometry[:2] == pytest.approx(geometry[2:4], abs=1) and geometry[4] is True, geometry
    assert geometry[5:] == [[[3, 1], [2, 1]], True], geometry  # points, and points with preemptions, per engine
    assert not severe_console(browser)
    open_page(browser, tmp_path / "run.html")
    assert browser.find_element(By.ID, "engine-panel").is_displayed()
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#steps td.engine")]
    assert cells == ["KV 97 % · 2 preempted", "KV 50 % · 0 preempted"], cells
    assert not severe_console(browser)
