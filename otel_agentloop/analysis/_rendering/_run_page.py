"""The run page: one self-contained HTML file for a whole run (inline CSS, JS and data; nothing fetched).

Per training step: the rollout wall time split into the time until the median sample finished and the tail
(median -> slowest), the slowest sample (identity, verdict, its cause in words, phase mix, trace id linked to
Jaeger and to the step's timeline page), p50/p90/p99/max per phase and per tool, failed/hung/slow counts and
staleness; validation passes in a table of their own. The charts are drawn on canvas from one inline JSON block
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
from typing import TYPE_CHECKING, Any

from ... import semconv as sc
from ...metrics._summary import FAILED, HUNG, SLOW, Distribution
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
]
"""The columns of ``steps`` in the page's data (one list per step)."""


def _r(x: float) -> float:
    return round(float(x), 4)


def _quantiles(d: Distribution | None) -> list[float] | int:
    return 0 if d is None or not d.count else [_r(d.p50), _r(d.p90), _r(d.p99), _r(d.max), d.count]


def page_data(
    steps: RunSteps,
    *,
    pages: Mapping[StepKey, str],
    source: str = "",
    jaeger_ui: str | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """What the page's script draws, as plain JSON-able data."""
    rows: list[list[Any]] = []
    phases: dict[str, list[Any]] = {p: [] for p in PHASES}
    tool_names = sorted({name for s in steps.summaries.values() for name in s.tools})
    tools: dict[str, list[Any]] = {name: [] for name in tool_names}
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
        "source": source,
        "notes": list(notes),
        "jaeger": jaeger_ui,
        "fields": STEP_FIELDS,
        "steps": rows,
        "phases": phases,
        "tools": tools,
    }


def render_run_page(
    steps: RunSteps,
    *,
    pages: Mapping[StepKey, str],
    source: str = "",
    jaeger_ui: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The page as one string."""
    title = f"run {steps.run.label} ({len(steps.summaries)} steps)"
    data = page_data(steps, pages=pages, source=source, jaeger_ui=jaeger_ui, notes=notes)
    return fill(_PAGE, title=title, css=_CSS, js=_JS, data=data)


def write_run_page(
    steps: RunSteps,
    path: str | os.PathLike[str],
    *,
    pages: Mapping[StepKey, str],
    source: str = "",
    jaeger_ui: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Write the page to ``path``; returns the path."""
    return write_page(path, render_run_page(steps, pages=pages, source=source, jaeger_ui=jaeger_ui, notes=notes))


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

_CSS = """
:root{--gen:#4C72B0;--tool:#DD8452;--score:#55A868;--err:#C44E52;--median:#4C72B0;--tail:#DD8452;
 font:13px/1.35 system-ui,sans-serif}
body{margin:0;color:#222;background:#fff}
header{padding:8px 14px;border-bottom:1px solid #ddd}
h1{font-size:17px;margin:0 0 2px}h2{font-size:13px;margin:0 0 4px}
#summary{color:#444}#notes{margin:4px 0 0;padding-left:18px;color:#8a5a00;font-size:12px}
main{padding:8px 14px;display:flex;flex-direction:column;gap:10px}
.panel{border:1px solid #e3e3e3;border-radius:4px;padding:6px 8px}
.grid{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:10px}
.chart{position:relative;height:190px}.chart.short{height:120px}.grid .chart{height:170px}
.chart canvas{display:block;width:100%;height:100%;cursor:crosshair}
.legend{display:flex;gap:12px;flex-wrap:wrap;font-size:12px;color:#444;margin-bottom:2px}
.chip{display:inline-block;width:16px;height:8px;margin-right:4px;border-radius:2px;vertical-align:0}
.hint{color:#777;margin:0 0 4px;font-size:12px}
.tablebox{max-height:520px;overflow:auto;border-top:1px solid #eee}
table{border-collapse:collapse;width:100%;font-size:12px}
th{position:sticky;top:0;background:#fafafa;text-align:right;padding:3px 6px;border-bottom:1px solid #ddd;z-index:1}
td{text-align:right;padding:2px 6px;border-bottom:1px solid #f3f3f3;white-space:nowrap}
th:first-child,td:first-child,td.id,th.id{text-align:left}
tr.step-row{cursor:pointer}tr.step-row:hover{background:#f4f8ff}tr.step-row.selected{background:#e4eeff}
td.bad{color:var(--err);font-weight:bold}
.mix{display:inline-flex;width:90px;height:9px;vertical-align:middle;background:#eee}
.mix i{display:block;height:100%}
.trace-id{font:11px ui-monospace,monospace}
.verdict{font:bold 9px/1 system-ui;padding:2px 3px;border-radius:3px;color:#fff;margin-left:4px}
.id .cause{font:11px system-ui,sans-serif;color:#555;white-space:normal}
.verdict.hung,.verdict.failed{background:var(--err)}.verdict.slow{background:#b8860b}
.rebuilt{color:#8a5a00}
#tip{position:fixed;z-index:10;background:#222;color:#fff;padding:6px 8px;border-radius:4px;font-size:12px;
 pointer-events:none;max-width:520px;box-shadow:0 2px 6px rgba(0,0,0,.3)}
#tip .mono{font-family:ui-monospace,monospace;font-size:11px}
#detail{position:fixed;right:14px;bottom:14px;background:#fff;border:1px solid #bbb;padding:8px 10px;
 box-shadow:0 2px 8px rgba(0,0,0,.2);max-width:520px;font-size:12px}
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("run-data").textContent);
  var F = {}; D.fields.forEach(function (name, k) { F[name] = k; });
  var PH_LABEL = {generate_sequences: "generation", tool_calls: "tool calls", compute_score: "reward"};
  var PH_COLOR = {generate_sequences: "#4C72B0", tool_calls: "#DD8452", compute_score: "#55A868"};
  var Q_NAMES = ["p50", "p90", "p99", "max"], Q_ALPHA = [0.35, 0.6, 0.85, 1];
  var PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                 "#CCB974", "#64B5CD"];
  var tip = document.getElementById("tip");

  function h(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function secs(x) { return x === null || x === undefined ? "-" : (x < 10 ? x.toFixed(3) : x.toFixed(2)) + " s"; }
  function num(x, d) { return x === null || x === undefined ? "-" : x.toFixed(d); }
  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }
  function niceStep(total, n) {
    var raw = Math.max(total, 1e-9) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10);
  }

  // -- the rows ---------------------------------------------------------------------------------
  var all = D.steps.map(function (r, k) { return {r: r, k: k}; });
  var train = all.filter(function (x) { return !x.r[F.validate]; });
  var val = all.filter(function (x) { return x.r[F.validate]; });
  var rowsByKey = {};

  // -- header -------------------------------------------------------------------------------------
  var samples = 0, failed = 0, hung = 0, slowN = 0, wall = 0;
  all.forEach(function (x) {
    samples += x.r[F.samples]; failed += x.r[F.failed]; hung += x.r[F.hung]; slowN += x.r[F.slow];
    if (!x.r[F.validate]) wall += x.r[F.wall_s];
  });
  var first = train.length ? train[0].r[F.step] : null, last = train.length ? train[train.length - 1].r[F.step] : null;
  var counted = function (n, noun, plural) { return n + " " + (n === 1 ? noun : plural || noun + "s"); };
  document.getElementById("title").textContent = "Run " + D.run + ": " + counted(train.length, "training step") +
    (train.length ? " (" + first + " to " + last + ")" : "") +
    (val.length ? " and " + counted(val.length, "validation pass", "validation passes") : "");
  document.getElementById("summary").textContent = counted(samples, "sample") + " · " + failed + " failed · " + hung +
    " hung · " + slowN + " slow · rollout wall time " + secs(wall) + " in all · service " + D.service +
    (D.attempts.length > 1 ? " · attempts " + D.attempts.join(", ") : "") + (D.source ? " · from " + D.source : "");
  var paged = all.filter(function (x) { return x.r[F.page]; }).length;
  document.getElementById("steps-hint").textContent = paged === all.length ? "Click a step to open its timeline page." :
    paged ? "Click a step to open its timeline page (" + paged + " of " + all.length + " steps have one here)." :
    "No step timeline pages were written with this page (--step-pages); click a step for the command that makes one.";
  var notes = document.getElementById("notes");
  D.notes.forEach(function (n) { notes.appendChild(h("li", null, n)); });

  // -- opening a step -------------------------------------------------------------------------------
  function openStep(x) {
    var page = x.r[F.page];
    if (page) { window.location.href = page; return; }
    var row = rowsByKey[x.k];
    if (row) { row.scrollIntoView({block: "center"}); select(row); }
    var d = document.getElementById("detail"); d.replaceChildren(); d.hidden = false;
    d.appendChild(h("div", null, "Step " + x.r[F.step] + " has no timeline page here. Make one with:"));
    d.appendChild(h("div", "trace-id", "otel-agentloop report --step " + x.r[F.step] +
      (x.r[F.validate] ? " --validate" : "") + " --html step.html"));
  }
  var selected = null;
  function select(row) {
    if (selected) selected.classList.remove("selected");
    selected = row; row.classList.add("selected");
  }

  // -- charts ---------------------------------------------------------------------------------------
  // opts: {el, xs: [rows], series: [{name, color, values(k) -> number|null, stack?}], ymin0, fmt}
  function chart(opts) {
    var el = opts.el, canvas = h("canvas"); el.replaceChildren(canvas);
    var n = opts.xs.length, dpr = window.devicePixelRatio || 1;
    var W = el.clientWidth || 600, H = el.clientHeight || 160;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    var g = canvas.getContext("2d"); g.scale(dpr, dpr);
    var L = 52, R = 8, T = 6, B = 20, pw = Math.max(W - L - R, 10), ph = Math.max(H - T - B, 10);
    var top = 0;
    for (var k = 0; k < n; k++) {
      var stack = 0;
      opts.series.forEach(function (s) {
        var v = s.values(opts.xs[k]);
        if (v === null || v === undefined) return;
        if (s.stack) { stack += v; top = Math.max(top, stack); } else top = Math.max(top, v);
      });
    }
    top = top > 0 ? top * 1.05 : 1;
    var yt = opts.integer ? Math.max(1, Math.round(niceStep(top, 4))) : niceStep(top, 4);
    g.font = "11px system-ui,sans-serif"; g.fillStyle = "#555"; g.strokeStyle = "#eee"; g.lineWidth = 1;
    for (var y = 0; y <= top + 1e-12; y += yt) {
      var py = T + ph - ph * y / top;
      g.beginPath(); g.moveTo(L, py + 0.5); g.lineTo(L + pw, py + 0.5); g.stroke();
      g.textAlign = "right"; g.fillText(opts.fmt ? opts.fmt(y) : (+y.toPrecision(3)) + "", L - 4, py + 4);
    }
    var bw = pw / Math.max(n, 1);
    function xOf(k) { return L + bw * (k + 0.5); }
    if (n) {
      var xt = Math.max(1, Math.ceil(n / Math.max(1, Math.floor(pw / 70))));
      g.textAlign = "center";
      for (var k2 = 0; k2 < n; k2 += xt) g.fillText(String(opts.xs[k2].r[F.step]), xOf(k2), H - 5);
    }
    var base = new Float64Array(n);
    opts.series.forEach(function (s) {
      if (s.stack) {
        g.fillStyle = s.color;
        for (var k = 0; k < n; k++) {
          var v = s.values(opts.xs[k]);
          if (!v) continue;
          var y0 = T + ph - ph * base[k] / top, y1 = T + ph - ph * (base[k] + v) / top;
          g.fillRect(L + bw * k + (bw > 3 ? 0.5 : 0), y1, Math.max(bw - (bw > 3 ? 1 : 0), 0.6), y0 - y1);
          base[k] += v;
        }
      } else {
        g.strokeStyle = s.color; g.lineWidth = s.width || 1.4; g.beginPath();
        var pen = false;
        for (var k = 0; k < n; k++) {
          var v = s.values(opts.xs[k]);
          if (v === null || v === undefined) { pen = false; continue; }
          var px = xOf(k), py = T + ph - ph * v / top;
          if (pen) g.lineTo(px, py); else g.moveTo(px, py);
          pen = true;
          if (n < 60) g.fillRect(px - 1.5, py - 1.5, 3, 3);
        }
        g.stroke();
      }
    });
    function at(ev) {
      var rect = canvas.getBoundingClientRect(), k = Math.floor((ev.clientX - rect.left - L) / bw);
      return k >= 0 && k < n ? opts.xs[k] : null;
    }
    canvas.addEventListener("mousemove", function (ev) {
      var x = at(ev);
      if (!x) { tip.hidden = true; return; }
      tip.replaceChildren();
      tip.appendChild(h("div", null, "step " + x.r[F.step] + " · " + x.r[F.samples] + " samples"));
      opts.series.forEach(function (s) {
        var v = s.values(x);
        tip.appendChild(h("div", null, s.name + ": " + (opts.fmt ? opts.fmt(v) : v === null ? "-" : secs(v))));
      });
      if (x.r[F.slowest_trace]) tip.appendChild(h("div", "mono", "slowest " + x.r[F.slowest_index] + "/" +
        x.r[F.slowest_rollout] + " · trace " + x.r[F.slowest_trace]));
      if (x.r[F.slowest_cause]) tip.appendChild(h("div", null, "why: " + x.r[F.slowest_cause]));
      tip.appendChild(h("div", null, x.r[F.page] ? "click: open the step's timeline" : "click: find the step"));
      tip.hidden = false;
      var px = ev.clientX + 14, py = ev.clientY + 14;
      if (px + tip.offsetWidth > window.innerWidth) px = ev.clientX - tip.offsetWidth - 10;
      if (py + tip.offsetHeight > window.innerHeight) py = ev.clientY - tip.offsetHeight - 10;
      tip.style.left = px + "px"; tip.style.top = py + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    canvas.addEventListener("click", function (ev) { var x = at(ev); if (x) openStep(x); });
    el.setAttribute("data-points", String(n));
  }
  function legend(el, items) {
    el.replaceChildren();
    items.forEach(function (it) {
      var s = h("span"), c = h("span", "chip"); c.style.background = it[1];
      s.appendChild(c); s.appendChild(document.createTextNode(it[0])); el.appendChild(s);
    });
  }
  function q(list, k, i) { var v = list[k]; return v ? v[i] : null; }

  var draws = [];
  legend(document.getElementById("wall-legend"), [["until the median sample finished", "#4C72B0"],
    ["tail (median to the last sample)", "#DD8452"]]);
  draws.push(function () {
    chart({el: document.getElementById("wall"), xs: train, series: [
      {name: "until median", color: "#4C72B0", stack: true, values: function (x) { return x.r[F.median_s]; }},
      {name: "tail", color: "#DD8452", stack: true, values: function (x) { return x.r[F.tail_s]; }}]});
  });
  legend(document.getElementById("verdict-legend"), [["failed", "#C44E52"], ["hung", "#6a1b1d"],
    ["slow", "#b8860b"]]);
  draws.push(function () {
    chart({el: document.getElementById("verdicts"), xs: train, integer: true, fmt: function (v) {
      return v === null ? "-" : String(Math.round(v)); }, series: [
      {name: "failed", color: "#C44E52", stack: true, values: function (x) { return x.r[F.failed]; }},
      {name: "hung", color: "#6a1b1d", stack: true, values: function (x) { return x.r[F.hung]; }},
      {name: "slow", color: "#b8860b", stack: true, values: function (x) { return x.r[F.slow]; }}]});
  });
  var grid = document.getElementById("phase-charts");
  Object.keys(D.phases).forEach(function (p) {
    var box = h("section", "panel"), title = h("h2", null, (PH_LABEL[p] || p) + " per sample: p50/p90/p99/max");
    var lg = h("div", "legend"), el = h("div", "chart");
    el.id = "phase-" + p;
    box.appendChild(title); box.appendChild(lg); box.appendChild(el); grid.appendChild(box);
    legend(lg, Q_NAMES.map(function (name, i) { return [name, rgba(PH_COLOR[p] || "#777777", Q_ALPHA[i])]; }));
    draws.push(function () {
      chart({el: el, xs: train, series: Q_NAMES.map(function (name, i) {
        return {name: name, color: rgba(PH_COLOR[p] || "#777777", Q_ALPHA[i]),
                values: function (x) { return q(D.phases[p], x.k, i); }};
      })});
    });
  });
  var toolNames = Object.keys(D.tools);
  if (!toolNames.length) document.getElementById("tools-panel").hidden = true;
  var toolQ = document.getElementById("tool-q");
  legend(document.getElementById("tool-legend"), toolNames.map(function (t, i) {
    return [t, PALETTE[i % PALETTE.length]]; }));
  function drawTools() {
    if (!toolNames.length) return;
    var i = +toolQ.value;
    chart({el: document.getElementById("tools"), xs: train, series: toolNames.map(function (t, n) {
      return {name: t + " " + Q_NAMES[i], color: PALETTE[n % PALETTE.length],
              values: function (x) { return q(D.tools[t], x.k, i); }};
    })});
  }
  toolQ.addEventListener("change", drawTools);
  draws.push(drawTools);
  if (train.some(function (x) { return x.r[F.staleness_mean] !== null; })) {
    document.getElementById("stale-panel").hidden = false;
    draws.push(function () {
      chart({el: document.getElementById("stale"), xs: train, fmt: function (v) { return num(v, 2); }, series: [
        {name: "mean", color: "#8172B3", values: function (x) { return x.r[F.staleness_mean]; }},
        {name: "max", color: "#C44E52", values: function (x) { return x.r[F.staleness_max]; }}]});
    });
  }

  // -- tables ---------------------------------------------------------------------------------------
  var HEAD = ["step", "samples", "wall", "to median", "tail", "slowest sample", "phase mix (gen/tool/reward)",
              "failed", "hung", "slow", "staleness", "slowest trace"];
  function table(id, xs) {
    var t = document.getElementById(id), head = t.tHead, body = t.tBodies[0], tr = h("tr");
    HEAD.forEach(function (name, i) { tr.appendChild(h("th", i === 5 || i === 11 ? "id" : null, name)); });
    head.appendChild(tr);
    var frag = document.createDocumentFragment();
    xs.forEach(function (x) {
      var r = x.r, row = h("tr", "step-row");
      row.setAttribute("data-step", String(r[F.step]));
      row.setAttribute("data-validate", r[F.validate] ? "true" : "false");
      var first = h("td");
      if (r[F.page]) {
        var a = h("a", "step-link", String(r[F.step])); a.setAttribute("href", r[F.page]); first.appendChild(a);
      } else first.textContent = String(r[F.step]);
      if (r[F.rebuilt]) {
        var mark = h("span", "rebuilt", " *"); mark.title = "no stored summary: rebuilt from the spans";
        first.appendChild(mark);
      }
      row.appendChild(first);
      row.appendChild(h("td", null, r[F.samples]));
      row.appendChild(h("td", null, secs(r[F.wall_s])));
      row.appendChild(h("td", null, secs(r[F.median_s])));
      row.appendChild(h("td", null, secs(r[F.tail_s])));
      var who = h("td", "id");
      if (r[F.slowest_index] !== null) {
        who.appendChild(document.createTextNode(r[F.slowest_index] + "/" + r[F.slowest_rollout] + " " +
          secs(r[F.gen_s] + r[F.tool_s] + r[F.score_s])));
        if (r[F.slowest_verdict] && r[F.slowest_verdict] !== "ok") {
          who.appendChild(h("span", "verdict " + r[F.slowest_verdict], r[F.slowest_verdict]));
        }
        if (r[F.slowest_cause]) who.appendChild(h("div", "cause", r[F.slowest_cause]));
      } else who.textContent = "-";
      row.appendChild(who);
      var mixCell = h("td"), mix = h("span", "mix"), tot = Math.max(r[F.gen_s] + r[F.tool_s] + r[F.score_s], 1e-9);
      [[F.gen_s, "#4C72B0"], [F.tool_s, "#DD8452"], [F.score_s, "#55A868"]].forEach(function (c) {
        var seg = h("i"); seg.style.width = (100 * r[c[0]] / tot) + "%"; seg.style.background = c[1];
        mix.appendChild(seg);
      });
      mixCell.title = "generation " + secs(r[F.gen_s]) + " · tool " + secs(r[F.tool_s]) + " · reward " +
        secs(r[F.score_s]);
      mixCell.appendChild(mix);
      mixCell.appendChild(document.createTextNode(" " + num(r[F.gen_s], 2) + "/" + num(r[F.tool_s], 2) + "/" +
        num(r[F.score_s], 2)));
      row.appendChild(mixCell);
      [F.failed, F.hung, F.slow].forEach(function (f) { row.appendChild(h("td", r[f] ? "bad" : null, r[f])); });
      row.appendChild(h("td", null, r[F.staleness_mean] === null ? "-" : num(r[F.staleness_mean], 2) + " (max " +
        num(r[F.staleness_max], 2) + ")"));
      var trace = h("td", "id");
      if (r[F.slowest_trace]) {
        trace.appendChild(h("span", "trace-id", r[F.slowest_trace]));
        if (D.jaeger) {
          var j = h("a", "jaeger-link", " Jaeger");
          j.setAttribute("href", D.jaeger + "/trace/" + encodeURIComponent(r[F.slowest_trace]));
          j.target = "_blank"; j.rel = "noopener noreferrer"; trace.appendChild(j);
        } else if (r[F.page]) {  // the sample's waterfall on the step's timeline page
          var w = h("a", "trace-link", " waterfall");
          w.setAttribute("href", r[F.page] + "#trace=" + encodeURIComponent(r[F.slowest_trace]) + "&sample=" +
            r[F.slowest_index] + "/" + r[F.slowest_rollout]);
          trace.appendChild(w);
        }
      } else trace.textContent = "-";
      row.appendChild(trace);
      row.addEventListener("click", function (ev) {
        if (ev.target && ev.target.tagName === "A") return;  // the link itself navigates
        select(row); openStep(x);
      });
      rowsByKey[x.k] = row;
      frag.appendChild(row);
    });
    body.appendChild(frag);
  }
  table("steps", train);
  if (val.length) { document.getElementById("val-panel").hidden = false; table("val-steps", val); }

  function drawAll() { draws.forEach(function (f) { f(); }); }
  drawAll();
  var pending = null;
  window.addEventListener("resize", function () {
    if (pending) clearTimeout(pending);
    pending = setTimeout(drawAll, 120);
  });
  document.body.setAttribute("data-ready", "true");
})();
"""
