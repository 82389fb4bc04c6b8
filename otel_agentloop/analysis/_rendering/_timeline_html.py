"""The step timeline page: one self-contained HTML file (inline CSS, JS and data; nothing fetched to view it).

Every sample of a step is a row on one time axis (the tail first: hung samples, then by end time, last-ending
first), its phase spans
coloured by ``rl.phase`` and overlapping ones (parallel tool calls) in separate lanes; failed samples, error spans,
hung and slow samples are marked. Hovering shows the sample's identity and phase times, clicking shows its
waterfall (and a link to the trace in the Jaeger UI named with ``--jaeger-ui``); per-phase histograms sit beside it.
``step.html#trace=ID&sample=I/R`` opens with that sample's waterfall shown: the run and compare pages link there.

Safety: the data travels as JSON in a ``<script type="application/json">`` block with ``<``, ``>`` and ``&``
escaped, and the page's script writes every string through ``textContent``/``setAttribute`` (never HTML), so span
names and attributes cannot inject markup. The Jaeger link is only made for an http(s) base URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ... import semconv as sc
from ...metrics._records import SpanRecord
from .._reading._engine import ENGINE_PARTS, Part, engine_parts
from .._reading._step_view import StepView, build_step_view, is_snapshot
from ._engine_text import engine_note
from ._html import HEAD, fill, jaeger_ui_base, write_page

_MS = 1e6  # ns per ms


class _Strings:
    """A string table: names repeat across samples, so rows carry indices."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        i = self._index.get(text)
        if i is None:
            i = self._index[text] = len(self.items)
            self.items.append(text)
        return i


def _info(span: Any) -> str:
    parts = []
    error_type = span.attributes.get(sc.ERROR_TYPE)
    if error_type is not None:
        parts.append(f"{sc.ERROR_TYPE}={error_type}")
    if span.status_message:
        parts.append(span.status_message)
    return "; ".join(parts)[:300]


def page_data(view: StepView, *, source: str = "", jaeger_ui: str | None = None) -> dict[str, Any]:
    """What the page's script draws, as plain JSON-able data (times in ms since the step's first sample)."""
    t0 = view.t0_ns
    strings = _Strings()
    phases = list(sc.PHASES)

    def ms(t: int) -> float:
        return round((t - t0) / _MS, 3)

    def parts(engine: list[Part]) -> list[list[float]]:
        return [[ENGINE_PARTS.index(name), ms(a), ms(b)] for name, a, b in engine]

    def wf_engine(span: SpanRecord) -> list[Any]:
        """The engine's parts of a turn and their note (nothing for a span without them: its entry as before)."""
        found = parts(engine_parts(span.start_ns, span.end_ns, span.attributes))
        return [found, strings(engine_note(span.attributes))] if found else []

    samples = []
    for s in view.samples:
        samples.append(
            {
                "i": s.index,
                "r": s.rollout,
                "tid": s.trace_id,
                "st": s.state,
                "s": ms(s.start_ns),
                "e": ms(s.end_ns),
                "ph": [round(s.phase_s[p], 6) for p in phases],
                "tot": round(s.total_s, 6),
                "lanes": s.lanes,
                "bars": [
                    [
                        phases.index(b.phase) if b.phase in phases else -1,
                        strings(b.name),
                        ms(b.start_ns),
                        ms(b.end_ns),
                        b.lane,
                        int(b.error),
                        int(b.open),
                        *([parts(b.engine)] if b.engine else []),
                    ]
                    for b in s.bars
                ],
                "wf": [
                    [
                        depth,
                        strings(span.name),
                        ms(span.start_ns),
                        ms(span.end_ns),
                        int(span.error),
                        strings(_info(span)),
                        int(span is s.snapshot),
                        *wf_engine(span),
                    ]
                    for depth, span in s.waterfall
                ],
                "snap": ms(s.snapshot.end_ns) if s.snapshot is not None else None,
                "cur": s.current_phase,
                "ended": s.ended,
                "errs": s.error_spans,
                "slowest": s.key == view.slowest,
                **({"cause": s.cause} if s.cause else {}),
            }
        )
    return {
        "step": view.step,
        "validate": view.validate,
        "source": source,
        "jaeger": jaeger_ui_base(jaeger_ui),
        "span_ms": ms(view.t1_ns),
        "phases": phases,
        "counts": view.counts,
        "verdicts_from": view.verdicts.source if view.verdicts is not None else "none",
        "names": strings.items,
        "samples": samples,
        "engine": any(b.engine for s in view.samples for b in s.bars),
    }


def render_html(view: StepView, *, source: str = "", jaeger_ui: str | None = None) -> str:
    """The page as one string."""
    title = f"step {view.step}{' (validation)' if view.validate else ''}: {len(view.samples)} samples"
    return fill(_PAGE, title=title, css=_CSS, js=_JS, data=page_data(view, source=source, jaeger_ui=jaeger_ui))


def write_html(view: StepView, path: str | os.PathLike[str], *, source: str = "", jaeger_ui: str | None = None) -> str:
    """Write the page to ``path``; returns the path."""
    return write_page(path, render_html(view, source=source, jaeger_ui=jaeger_ui))


def step_page_name(key: tuple[int, bool]) -> str:
    return f"step-{key[0]}{'-validation' if key[1] else ''}.html"


def write_step_pages(
    spans: Mapping[tuple[int, bool], Sequence[SpanRecord]],
    page: str,
    *,
    source: str = "",
    jaeger_ui: str | None = None,
) -> dict[tuple[int, bool], str]:
    """The timeline pages of the steps in ``spans`` (step key -> that step's records) that have sample spans or
    snapshots, written in a folder beside the page ``page`` (``run.html`` -> ``run.steps/step-3.html``); returns
    their paths relative to ``page``'s folder. Their traces link here (``step-3.html#trace=ID``) by default."""
    folder_name = os.path.splitext(os.path.basename(page))[0] + ".steps"
    folder = os.path.join(os.path.dirname(page) or ".", folder_name)
    written: dict[tuple[int, bool], str] = {}
    for key, records in spans.items():
        if not any(r.name == sc.SAMPLE_SPAN or is_snapshot(r) for r in records):
            continue
        if not os.path.isdir(folder):
            os.mkdir(folder)  # beside the page, whose folder exists
        view = build_step_view(records, key[0], key[1])
        write_html(view, os.path.join(folder, step_page_name(key)), source=source, jaeger_ui=jaeger_ui)
        written[key] = f"{folder_name}/{step_page_name(key)}"
    return written


_PAGE = (
    HEAD
    + """<body>
<header><h1 id="title"></h1><div id="summary"></div><div id="legend"></div></header>
<main>
<section id="timeline"><div id="scroller"><div id="axis"></div>
<div id="rows"><div id="grid"></div></div></div></section>
<aside><div id="hists"></div><div id="detail"><p class="hint">Click a row to see that sample's waterfall.</p></div>
</aside></main>
<div id="tip" hidden></div>
<script id="timeline-data" type="application/json">%DATA%</script>
<script>%JS%</script>
</body></html>
"""
)

_CSS = """
:root{--gen:#4C72B0;--tool:#DD8452;--score:#55A868;--err:#C44E52;--label:150px;font:13px/1.35 system-ui,sans-serif}
body{margin:0;color:#222;background:#fff}
header{padding:8px 14px;border-bottom:1px solid #ddd}
h1{font-size:17px;margin:0 0 2px}
#summary{color:#444}
#legend{margin-top:4px;display:flex;gap:14px;flex-wrap:wrap;color:#444}
.chip{display:inline-block;width:18px;height:10px;margin-right:4px;vertical-align:-1px;border-radius:2px}
main{display:flex;gap:12px;padding:8px 14px;align-items:flex-start}
#timeline{flex:3;min-width:0}
#scroller{max-height:calc(100vh - 110px);overflow-y:auto;overflow-x:hidden;border:1px solid #e3e3e3}
#axis{position:sticky;top:0;height:20px;background:#fafafa;border-bottom:1px solid #ddd;z-index:3}
#axis span{position:absolute;top:3px;transform:translateX(-50%);font-size:11px;color:#555;white-space:nowrap}
#rows{position:relative}
#grid{position:absolute;left:var(--label);right:8px;top:0;bottom:0;pointer-events:none}
#grid i{position:absolute;top:0;bottom:0;border-left:1px solid #eee}
.row{display:flex;align-items:stretch;cursor:pointer;border-bottom:1px solid #f3f3f3}
.row:hover{background:#f4f8ff}.row.selected{background:#e4eeff}
.label{width:var(--label);flex:none;padding:0 6px;font:11px/1 ui-monospace,monospace;display:flex;gap:4px;
 align-items:center;white-space:nowrap;overflow:hidden}
.label .tag{font:bold 9px/1 system-ui,sans-serif;padding:2px 3px;border-radius:3px;color:#fff}
.tag.slowest{background:#6a3d9a}.tag.hung{background:var(--err)}.tag.slow{background:#b8860b}.tag.failed{background:var(--err)}
.row.failed .label{color:var(--err)}
.track{position:relative;flex:1;margin-right:8px}
.life{position:absolute;top:50%;height:2px;margin-top:-1px;background:#bbb}
.row.hung .life{background:repeating-linear-gradient(90deg,var(--err) 0 4px,transparent 4px 7px)}
.bar{position:absolute;min-width:1px;border-radius:1px;opacity:.92}
.bar.p0{background:var(--gen)}.bar.p1{background:var(--tool)}.bar.p2{background:var(--score)}.bar.p-1{background:#999}
.bar.err{background:var(--err);outline:1px solid #7a1f22}
.bar.open{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.65) 0 3px,transparent 3px 7px);
 outline:2px solid var(--err)}
.eng{position:absolute;top:0;bottom:0;pointer-events:auto}
.eng.e0{background:#c9d6ee}.eng.e1{background:#8fa8d6}.eng.e2{background:#1f3a68}
.wf-eng{font:10px ui-monospace,monospace;color:#1f3a68;padding-left:14px}
.snap{position:absolute;top:0;bottom:0;width:0;border-left:2px dotted var(--err)}
.end-mark{position:absolute;top:50%;transform:translate(3px,-50%);font:bold 9px/1 system-ui;color:var(--err);
 background:#fff;padding:1px 2px;border-radius:2px;white-space:nowrap}
aside{flex:2;min-width:380px;max-width:640px;position:sticky;top:8px}
#hists{display:grid;grid-template-columns:1fr 1fr;gap:8px 14px;margin-bottom:10px}
.hist h3{font-size:12px;margin:0 0 2px}.hist .stats{font-size:11px;color:#555}
.hist .plot{position:relative;height:64px;display:flex;align-items:flex-end;gap:1px;border-bottom:1px solid #999}
.hist .plot b{flex:1;min-height:0}
.hist .range{display:flex;justify-content:space-between;font-size:10px;color:#666}
.hist .marker{position:absolute;top:-2px;bottom:0;border-left:2px solid #6a3d9a}
#detail{border:1px solid #ddd;padding:8px;max-height:calc(100vh - 300px);overflow:auto}
#detail h2{font-size:14px;margin:0 0 4px}.hint{color:#777;margin:0}
.ids{font:11px ui-monospace,monospace;color:#333;margin-bottom:6px;word-break:break-all}
.wf-row{display:flex;align-items:center;height:18px;font:11px ui-monospace,monospace}
.wf-name{width:210px;flex:none;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.wf-track{position:relative;flex:1;height:12px;background:#f6f6f6}
.wf-dur{width:70px;flex:none;text-align:right}
.wf-row.err .wf-name,.wf-row.err .wf-dur{color:var(--err)}
.wf-row.snapshot .wf-name{font-style:italic}
.wf-info{font:10px ui-monospace,monospace;color:var(--err);padding-left:14px}
#tip{position:fixed;z-index:10;background:#222;color:#fff;padding:6px 8px;border-radius:4px;font-size:12px;
 pointer-events:none;max-width:460px;box-shadow:0 2px 6px rgba(0,0,0,.3)}
#tip .mono{font-family:ui-monospace,monospace;font-size:11px}
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("timeline-data").textContent);
  var PH_LABEL = {generate_sequences: "generation", tool_calls: "tool", compute_score: "reward"};
  var ENGINE = ["queue", "prefill", "decode"];
  var span = Math.max(D.span_ms, 1e-3);

  function h(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function pct(ms) { return (100 * ms / span) + "%"; }
  function secs(x) { return (x < 10 ? x.toFixed(3) : x.toFixed(2)) + " s"; }
  function niceStep(total, n) {
    var raw = total / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10);
  }
  function sampleName(s) { return "sample " + s.i + " / rollout " + s.r; }
  function stateText(s) {
    var seen = s.snap !== null ? " at +" + secs(s.snap / 1e3) : "";
    if (s.st === "hung") {
      return "HUNG in " + (PH_LABEL[s.cur] || s.cur) + ": still running when the step was collected (reported" +
        seen + (s.ended ? "; ended at +" + secs(s.e / 1e3) + ", after the collect" : "; no end") + ")";
    }
    if (s.st === "slow") return "slow (watchdog reported it" + seen + ", finished before the collect)";
    if (s.st === "failed") return "FAILED";
    return "ok" + (s.errs ? " (" + s.errs + " error span" + (s.errs > 1 ? "s" : "") + ")" : "");
  }

  // -- header ----------------------------------------------------------------------------------
  var c = D.counts, slow = null;
  D.samples.forEach(function (s) { if (s.slowest) slow = s; });
  document.getElementById("title").textContent =
    "Step " + D.step + (D.validate ? " (validation)" : "") + ": " + D.samples.length + " samples on one time axis";
  document.getElementById("summary").textContent =
    (c.failed || 0) + " failed · " + (c.hung || 0) + " hung · " + (c.slow || 0) + " slow · step span " +
    secs(D.span_ms / 1e3) +
    (slow ? " · slowest: " + sampleName(slow) + " (" + secs(slow.tot) + " gen+tool+score" +
            (slow.cause ? "; " + slow.cause : "") + ")" : "") +
    (D.verdicts_from === "summary" ? " · hung/slow as collected (step summary)" :
     D.verdicts_from === "snapshots" ? " · hung/slow from watchdog snapshots" : "") +
    (D.source ? " · from " + D.source : "");
  var legend = document.getElementById("legend");
  [["var(--gen)", "generation"], ["var(--tool)", "tool call"], ["var(--score)", "reward"], ["var(--err)", "error"],
   ["repeating-linear-gradient(45deg,#DD8452 0 3px,#fff 3px 6px)", "open phase of a hung sample"]
  ].concat(D.engine ? [["#c9d6ee", "engine queue"], ["#8fa8d6", "engine prefill"], ["#1f3a68", "engine decode"]] : []
  ).forEach(function (x) {
    var item = h("span"), chip = h("span", "chip");
    chip.style.background = x[0];
    item.appendChild(chip); item.appendChild(document.createTextNode(x[1])); legend.appendChild(item);
  });
  legend.appendChild(h("span", null, "hung first, then by end time, last-ending first; overlapping bars are " +
                                    "parallel calls"));

  // -- axis and grid ---------------------------------------------------------------------------
  var axis = document.getElementById("axis"), grid = document.getElementById("grid");
  var stepS = niceStep(span / 1e3, 8);
  var axisTrack = h("div"); axisTrack.style.cssText = "position:absolute;left:var(--label);right:8px;top:0;bottom:0";
  axis.appendChild(axisTrack);
  for (var t = 0; t <= span / 1e3 + 1e-9; t += stepS) {
    var lab = h("span", null, (+t.toFixed(6)) + " s"); lab.style.left = pct(t * 1e3); axisTrack.appendChild(lab);
    var line = h("i"); line.style.left = pct(t * 1e3); grid.appendChild(line);
  }

  // -- rows --------------------------------------------------------------------------------------
  var rows = document.getElementById("rows"), tip = document.getElementById("tip");
  var selectedRow = null, found = {};
  D.samples.forEach(function (s, n) {
    var row = h("div", "row" + (s.st === "hung" ? " hung" : "") + (s.st === "failed" ? " failed" : ""));
    row.setAttribute("data-sample", s.i + "/" + s.r);
    row.setAttribute("data-trace-id", s.tid);
    row.setAttribute("data-state", s.st);
    if (s.slowest) row.setAttribute("data-slowest", "true");
    var laneH = s.lanes > 1 ? 7 : 12;
    row.style.height = (s.lanes * laneH + 6) + "px";
    var label = h("div", "label");
    label.appendChild(h("span", null, s.i + "/" + s.r));
    if (s.slowest) label.appendChild(h("span", "tag slowest", "slowest"));
    if (s.st === "hung") label.appendChild(h("span", "tag hung", "HUNG"));
    if (s.st === "slow") label.appendChild(h("span", "tag slow", "slow"));
    if (s.st === "failed") label.appendChild(h("span", "tag failed", "failed"));
    row.appendChild(label);
    var track = h("div", "track");
    var life = h("div", "life"); life.style.left = pct(s.s); life.style.width = pct(s.e - s.s); track.appendChild(life);
    s.bars.forEach(function (b, k) {
      var bar = h("div", "bar p" + b[0] + (b[5] ? " err" : "") + (b[6] ? " open" : ""));
      bar.style.left = pct(b[2]); bar.style.width = pct(Math.max(b[3] - b[2], 0));
      bar.style.top = (3 + b[4] * laneH) + "px"; bar.style.height = (laneH - 1) + "px";
      bar.setAttribute("data-bar", String(k));
      engineParts(bar, b[7], b[2], b[3], String(k));
      track.appendChild(bar);
    });
    if (s.snap !== null) {
      var snap = h("div", "snap"); snap.style.left = pct(s.snap); track.appendChild(snap);
    }
    if (s.st === "hung") {
      var mark = h("span", "end-mark", s.ended ? "hung at collect" : "still open"); mark.style.left = pct(s.e);
      if (s.e > 0.8 * span) mark.style.transform = "translate(calc(-100% - 4px), -50%)";  // inside, at the edge
      track.appendChild(mark);
    }
    row.appendChild(track);
    row.addEventListener("mousemove", function (ev) { showTip(s, ev); });
    row.addEventListener("mouseleave", function () { tip.hidden = true; });
    row.addEventListener("click", function () { select(s, row); });
    rows.appendChild(row);
    found[s.i + "/" + s.r] = found[s.i + "/" + s.r] || [s, row];
    found[s.tid] = found[s.tid] || [s, row];
  });

  // -- a link to one sample's waterfall: page.html#trace=ID&sample=I/R (the sample wins; a trace holds several
  // samples with --trace-per step) ----------------------------------------------------------------------------
  function fromHash() {
    var want = {};
    window.location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var at = kv.indexOf("="); if (at > 0) want[kv.slice(0, at)] = decodeURIComponent(kv.slice(at + 1));
    });
    var hit = (want.sample && found[want.sample]) || (want.trace && found[want.trace]);
    if (!hit) return;
    select(hit[0], hit[1]); hit[1].scrollIntoView({block: "center"});
  }
  window.addEventListener("hashchange", fromHash);

  // the engine's queue, prefill and decode drawn inside a turn's bar (parts: [[part, start ms, end ms], ...])
  function engineParts(bar, parts, s, e, k) {
    if (!parts) return;
    var len = Math.max(e - s, 1e-6);
    parts.forEach(function (p) {
      var x = h("span", "eng e" + p[0]);
      x.style.left = (100 * (p[1] - s) / len) + "%"; x.style.width = (100 * (p[2] - p[1]) / len) + "%";
      x.setAttribute("data-engine", ENGINE[p[0]]);
      if (k !== null) x.setAttribute("data-bar", k);
      bar.appendChild(x);
    });
  }

  function showTip(s, ev) {
    tip.replaceChildren();
    tip.appendChild(h("div", null, sampleName(s) + " · step " + D.step + (D.validate ? " (validation)" : "")));
    tip.appendChild(h("div", "mono", "trace " + s.tid));
    tip.appendChild(h("div", null, stateText(s)));
    if (s.cause) tip.appendChild(h("div", null, "cause: " + s.cause));
    tip.appendChild(h("div", null, "start +" + secs(s.s / 1e3) + " · end +" + secs(s.e / 1e3) +
                                   " · gen+tool+score " + secs(s.tot)));
    tip.appendChild(h("div", null, D.phases.map(function (p, k) {
      return PH_LABEL[p] + " " + secs(s.ph[k]);
    }).join(" · ")));
    var k = ev.target && ev.target.getAttribute ? ev.target.getAttribute("data-bar") : null;
    if (k !== null) {
      var b = s.bars[+k];
      tip.appendChild(h("div", "mono", "▶ " + D.names[b[1]] + ": " + secs((b[3] - b[2]) / 1e3) + " (+" +
        secs(b[2] / 1e3) + " → +" + secs(b[3] / 1e3) + ")" + (b[5] ? " ERROR" : "") + (b[6] ? " still open" : "")));
      (b[7] || []).forEach(function (p) {
        tip.appendChild(h("div", "mono", "  engine " + ENGINE[p[0]] + " " + secs((p[2] - p[1]) / 1e3)));
      });
    }
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth) x = ev.clientX - tip.offsetWidth - 10;
    if (y + tip.offsetHeight > window.innerHeight) y = ev.clientY - tip.offsetHeight - 10;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  }

  // -- histograms ----------------------------------------------------------------------------------
  var finished = D.samples.filter(function (s) { return s.st !== "hung"; });
  var hists = [];
  D.phases.concat(["total"]).forEach(function (p, k) {
    var vals = finished.map(function (s) { return p === "total" ? s.tot : s.ph[k]; });
    var box = h("div", "hist"); box.setAttribute("data-phase", p);
    box.appendChild(h("h3", null, p === "total" ? "sample total (gen+tool+score)" : p + " (per sample)"));
    var sorted = vals.slice().sort(function (a, b) { return a - b; });
    var q = function (f) {
      return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(f * sorted.length))] : 0;
    };
    var max = sorted.length ? sorted[sorted.length - 1] : 0;
    box.appendChild(h("div", "stats", "p50 " + secs(q(0.5)) + " · p90 " + secs(q(0.9)) + " · max " + secs(max) +
                                      " · n " + vals.length));
    var plot = h("div", "plot"), nb = 24, counts = new Array(nb).fill(0), top = Math.max(max, 1e-9);
    vals.forEach(function (v) { counts[Math.min(nb - 1, Math.floor(nb * v / top))]++; });
    var cmax = Math.max.apply(null, counts.concat([1]));
    counts.forEach(function (n, i) {
      var b = h("b"); b.style.height = (100 * n / cmax) + "%";
      b.style.background = p === "total" ? "#777" : ["var(--gen)", "var(--tool)", "var(--score)"][k];
      b.title = n + " samples in " + secs(i * top / nb) + " to " + secs((i + 1) * top / nb);
      plot.appendChild(b);
    });
    var marker = h("div", "marker"); marker.hidden = true; plot.appendChild(marker);
    box.appendChild(plot);
    var range = h("div", "range");
    range.appendChild(h("span", null, "0")); range.appendChild(h("span", null, secs(max)));
    box.appendChild(range);
    document.getElementById("hists").appendChild(box);
    hists.push({p: p, k: k, top: top, marker: marker});
  });

  // -- the selected sample's waterfall -----------------------------------------------------------
  function select(s, row) {
    if (selectedRow) selectedRow.classList.remove("selected");
    selectedRow = row; row.classList.add("selected");
    hists.forEach(function (x) {
      var v = x.p === "total" ? s.tot : s.ph[x.k];
      x.marker.hidden = s.st === "hung"; x.marker.style.left = (100 * Math.min(v / x.top, 1)) + "%";
    });
    var d = document.getElementById("detail"); d.replaceChildren();
    d.setAttribute("data-sample", s.i + "/" + s.r);
    d.appendChild(h("h2", null, sampleName(s) + " · step " + D.step + (D.validate ? " (validation)" : "")));
    var ids = h("div", "ids"); ids.appendChild(h("span", "trace-id", s.tid)); d.appendChild(ids);
    d.appendChild(h("div", null, stateText(s) + " · gen+tool+score " + secs(s.tot)));
    if (s.cause) d.appendChild(h("div", "cause", "cause: " + s.cause));
    var own = h("a", "trace-link", "link to this waterfall");
    own.href = "#trace=" + encodeURIComponent(s.tid) + "&sample=" + s.i + "/" + s.r; d.appendChild(own);
    if (D.jaeger) {
      var a = h("a", "jaeger-link", "open this trace in Jaeger");
      a.href = D.jaeger + "/trace/" + encodeURIComponent(s.tid); a.target = "_blank"; a.rel = "noopener noreferrer";
      d.appendChild(document.createTextNode(" · ")); d.appendChild(a);
    }
    var wf = h("div", "waterfall"), t0 = Math.min.apply(null, s.wf.map(function (w) { return w[2]; }));
    var t1 = Math.max.apply(null, s.wf.map(function (w) { return w[3]; })), tot = Math.max(t1 - t0, 1e-3);
    var head = h("div", "wf-row"); head.appendChild(h("span", "wf-name", "span"));
    head.appendChild(h("span", "wf-track-head", "0 … " + secs(tot / 1e3))); wf.appendChild(head);
    s.wf.forEach(function (w) {
      var r = h("div", "wf-row" + (w[4] ? " err" : "") + (w[6] ? " snapshot" : ""));
      var name = h("span", "wf-name", D.names[w[1]]); name.style.paddingLeft = (w[0] * 12) + "px";
      name.title = D.names[w[1]];
      var tr = h("span", "wf-track"), bar = h("span", "bar"), ph = -1;
      s.bars.forEach(function (b) { if (b[1] === w[1] && b[2] === w[2]) ph = b[0]; });
      bar.className = "bar p" + ph + (w[4] ? " err" : "") + (w[6] ? " open" : "");
      bar.style.top = "1px"; bar.style.height = "10px";
      bar.style.left = (100 * (w[2] - t0) / tot) + "%"; bar.style.width = (100 * (w[3] - w[2]) / tot) + "%";
      engineParts(bar, w[7], w[2], w[3], null);
      tr.appendChild(bar);
      r.appendChild(name); r.appendChild(tr); r.appendChild(h("span", "wf-dur", secs((w[3] - w[2]) / 1e3)));
      wf.appendChild(r);
      if (D.names[w[5]]) wf.appendChild(h("div", "wf-info", D.names[w[5]]));
      if (w[7]) wf.appendChild(h("div", "wf-eng", "engine: " + D.names[w[8]]));
    });
    d.appendChild(wf);
  }
  fromHash();
})();
"""
