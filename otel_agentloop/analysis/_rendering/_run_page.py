"""The run page: one self-contained HTML file for a whole run (inline CSS, JS and data; nothing fetched).

Per training step: the rollout wall time split into the time until the median sample finished and the tail
(median -> slowest), the slowest sample (identity, verdict, its cause in words, phase mix, trace id linked to
Jaeger and to the step's timeline page), p50/p90/p99/max per phase and per tool, failed/hung/slow counts,
staleness, and the engine's peak KV cache usage and preemptions (from the turns' engine state, issue 36);
validation passes in a table of their own. The charts are drawn on canvas from one inline JSON block
(a row of numbers per step), so a run of 1000 steps stays light; the step table has one row per step. Clicking a
step (a chart or its row) opens its timeline page when one was written (``report --run --html run.html`` writes them to
``run.steps/``), else shows the command that makes it.

Safety as on the step page: the data is JSON in a ``<script type="application/json">`` block with ``<``, ``>``
and ``&`` escaped, every string goes through ``textContent``/``setAttribute``, and links are only made to an
http(s) Jaeger base and to the relative step-page paths this module chose.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ... import semconv as sc
from ...metrics._summary import FAILED, HUNG, SLOW, Distribution
from ._assets import asset
from ._html import HEAD, fill, write_page

if TYPE_CHECKING:
    from .._reading._runs import RunSteps, StepKey

PHASES = (sc.GENERATE, sc.TOOL_CALLS, sc.COMPUTE_SCORE)
STEP_FIELDS = [
    "step",
    "validate",
    "samples",
    "wall_s",
    "median_s",
    "tail_s",
    "slowest_index",
    "slowest_rollout",
    "slowest_trace",
    "gen_s",
    "tool_s",
    "score_s",
    "slowest_verdict",
    "failed",
    "hung",
    "slow",
    "staleness_mean",
    "staleness_max",
    "page",
    "rebuilt",
    "slowest_cause",
    "kv_peak",
    "preemptions",
]
"""The columns of ``steps`` in the page's data (one list per step)."""


KV_PEAK = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/{sc.ENGINE_KV_CACHE_USAGE}/max"
PREEMPTIONS = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/{sc.ENGINE_PREEMPTIONS}"
"""The engine's peak KV cache usage and preemptions of a step, from its summary's metrics (``collect()``'s)."""


def _r(x: float) -> float:
    return round(float(x), 4)


def _quantiles(d: Distribution | None) -> list[float] | int:
    return 0 if d is None or not d.count else [_r(d.p50), _r(d.p90), _r(d.p99), _r(d.max), d.count]


@dataclass(frozen=True)
class RunPage:
    """What a run's page shows: its ``steps``, the step pages' paths by step (``pages``, relative), where the
    spans were read (``source``), the Jaeger UI to link to (``jaeger_ui``) and lines for people (``notes``)."""

    steps: RunSteps
    pages: Mapping[StepKey, str]
    source: str = ""
    jaeger_ui: str | None = None
    notes: Sequence[str] = ()


def page_data(page: RunPage) -> dict[str, object]:
    """What the page's script draws, as plain JSON-able data."""
    steps, pages = page.steps, page.pages
    rows: list[list[object]] = []
    phases: dict[str, list[object]] = {p: [] for p in PHASES}
    tool_names = sorted({name for s in steps.summaries.values() for name in s.tools})
    tools: dict[str, list[object]] = {name: [] for name in tool_names}
    for key, s in steps.summaries.items():
        slow = s.slowest
        rows.append(
            [
                key[0],
                int(key[1]),
                s.num_samples,
                _r(s.wall_s),
                _r(s.median_s),
                _r(s.tail_s),
                slow.index if slow else None,
                slow.rollout if slow else None,
                slow.trace_id if slow else None,
                _r(slow.generate_s) if slow else 0,
                _r(slow.tool_s) if slow else 0,
                _r(slow.score_s) if slow else 0,
                slow.verdict if slow else None,
                int(s.counts.get(FAILED, 0)),
                int(s.counts.get(HUNG, 0)),
                int(s.counts.get(SLOW, 0)),
                None if s.staleness_mean is None else _r(s.staleness_mean),
                None if s.staleness_max is None else _r(s.staleness_max),
                pages.get(key),
                int(key in steps.rebuilt),
                slow.cause if slow and slow.cause else None,
                None if (kv := s.metrics.get(KV_PEAK)) is None else _r(kv),
                None if (pre := s.metrics.get(PREEMPTIONS)) is None else int(pre),
            ]
        )
        for p in PHASES:
            phases[p].append(_quantiles(s.phases.get(p)))
        for name in tool_names:
            tools[name].append(_quantiles(s.tools.get(name)))
    run = steps.run
    return {
        "run": run.label,
        "has_id": run.has_id,
        "attempts": run.attempts,
        "service": run.service,
        "source": page.source,
        "notes": list(page.notes),
        "jaeger": page.jaeger_ui,
        "fields": STEP_FIELDS,
        "steps": rows,
        "phases": phases,
        "tools": tools,
    }


def render_run_page(page: RunPage) -> str:
    """The page as one string."""
    title = f"run {page.steps.run.label} ({len(page.steps.summaries)} steps)"
    return fill(_PAGE, title=title, css=asset("run.css"), js=asset("run.js"), data=page_data(page))


def write_run_page(page: RunPage, path: str | os.PathLike[str]) -> str:
    """Write the page to ``path``; returns the path."""
    return write_page(path, render_run_page(page))


_PAGE = (
    HEAD
    + """<body>
<header><h1 id="title"></h1><div id="summary"></div><ul id="notes"></ul></header>
<main>
<section class="panel wide"><h2>Rollout wall time per step: until the median sample finished, and the tail</h2>
<div class="legend" id="wall-legend"></div><div class="chart" id="wall"></div></section>
<section class="panel wide"><h2>Failed, hung and slow samples per step</h2>
<div class="legend" id="verdict-legend"></div><div class="chart short" id="verdicts"></div></section>
<div id="phase-charts" class="grid"></div>
<section class="panel wide" id="tools-panel"><h2>Tool calls per step, one line per tool:
<select id="tool-q"><option value="0">p50</option><option value="1" selected>p90</option><option value="2">p99</option>
<option value="3">max</option></select></h2><div class="legend" id="tool-legend"></div>
<div class="chart" id="tools"></div></section>
<section class="panel wide" id="engine-panel" hidden><h2>Engine per step: peak KV cache usage and preemptions</h2>
<div class="legend" id="engine-legend"></div><div class="chart short" id="kv-peak"></div>
<div class="chart short" id="preempted"></div></section>
<section class="panel wide" id="stale-panel" hidden><h2>Staleness per step (mean and max)</h2>
<div class="chart short" id="stale"></div></section>
<section class="panel wide"><h2>Steps</h2><p class="hint"><span id="steps-hint"></span>
The slowest sample is verl's (argmax of generation + tool + reward seconds).</p>
<div class="tablebox"><table id="steps"><thead></thead><tbody></tbody></table></div></section>
<section class="panel wide" id="val-panel" hidden><h2>Validation passes</h2>
<div class="tablebox"><table id="val-steps"><thead></thead><tbody></tbody></table></div></section>
<div id="detail" hidden></div>
</main>
<div id="tip" hidden></div>
<script id="run-data" type="application/json">%DATA%</script>
<script>%JS%</script>
</body></html>
"""
)
