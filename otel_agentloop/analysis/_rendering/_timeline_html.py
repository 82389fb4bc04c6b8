"""The step timeline page: one self-contained HTML file (inline CSS, JS and data; nothing fetched to view it).

Every sample of a step is a row on one time axis (the tail first: hung samples, then by end time, last-ending
first), its phase spans
coloured by ``rl.phase`` and overlapping ones (parallel tool calls) in separate lanes; failed samples, error spans,
hung and slow samples are marked. Under the samples, on their time axis, each engine's load while they ran
(``rl.engine.load`` spans: running and waiting requests, KV cache usage, preemptions). Hovering shows the
sample's identity and phase times, clicking shows its waterfall (and a link to the trace in the Jaeger UI named
with ``--jaeger-ui``); per-phase histograms sit beside it.
``step.html#trace=ID&sample=I/R`` opens with that sample's waterfall shown: the run and compare pages link there.

Safety: the data travels as JSON in a ``<script type="application/json">`` block with ``<``, ``>`` and ``&``
escaped, and the page's script writes every string through ``textContent``/``setAttribute`` (never HTML), so span
names and attributes cannot inject markup. The Jaeger link is only made for an http(s) base URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ... import semconv as sc
from ...metrics._records import SpanRecord
from .._reading._engine import ENGINE_PARTS, Part, engine_parts
from .._reading._step_view import Bar, SampleView, StepView, build_step_view, is_snapshot
from ._assets import asset
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


def _info(span: SpanRecord) -> str:
    parts = []
    error_type = span.attributes.get(sc.ERROR_TYPE)
    if error_type is not None:
        parts.append(f"{sc.ERROR_TYPE}={error_type}")
    if span.status_message:
        parts.append(span.status_message)
    return "; ".join(parts)[:300]


class _Encoder:
    """One page's compact encoding: times in ms since the step's first sample, names through one string table."""

    def __init__(self, view: StepView) -> None:
        self.t0 = view.t0_ns
        self.strings = _Strings()
        self.phases = list(sc.PHASES)
        self.slowest = view.slowest

    def ms(self, t: int) -> float:
        return round((t - self.t0) / _MS, 3)

    def parts(self, engine: list[Part]) -> list[list[float]]:
        return [[ENGINE_PARTS.index(name), self.ms(a), self.ms(b)] for name, a, b in engine]

    def wf_engine(self, span: SpanRecord) -> list[object]:
        """The engine's parts of a turn and their note (nothing for a span without them: its entry as before)."""
        found = self.parts(engine_parts(span.start_ns, span.end_ns, span.attributes))
        return [found, self.strings(engine_note(span.attributes))] if found else []

    def bar(self, b: Bar) -> list[object]:
        return [
            self.phases.index(b.phase) if b.phase in self.phases else -1,
            self.strings(b.name),
            self.ms(b.start_ns),
            self.ms(b.end_ns),
            b.lane,
            int(b.error),
            int(b.open),
            *([self.parts(b.engine)] if b.engine else []),
        ]

    def waterfall_row(self, s: SampleView, depth: int, span: SpanRecord) -> list[object]:
        return [
            depth,
            self.strings(span.name),
            self.ms(span.start_ns),
            self.ms(span.end_ns),
            int(span.error),
            self.strings(_info(span)),
            int(span is s.snapshot),
            *self.wf_engine(span),
        ]

    def sample(self, s: SampleView) -> dict[str, object]:
        return {
            "i": s.index,
            "r": s.rollout,
            "tid": s.trace_id,
            "st": s.state,
            "s": self.ms(s.start_ns),
            "e": self.ms(s.end_ns),
            "ph": [round(s.phase_s[p], 6) for p in self.phases],
            "tot": round(s.total_s, 6),
            "lanes": s.lanes,
            "bars": [self.bar(b) for b in s.bars],
            "wf": [self.waterfall_row(s, depth, span) for depth, span in s.waterfall],
            "snap": self.ms(s.snapshot.end_ns) if s.snapshot is not None else None,
            "cur": s.current_phase,
            "ended": s.ended,
            "errs": s.error_spans,
            "slowest": s.key == self.slowest,
            **({"cause": s.cause} if s.cause else {}),
        }


def page_data(view: StepView, *, source: str = "", jaeger_ui: str | None = None) -> dict[str, object]:
    """What the page's script draws, as plain JSON-able data (times in ms since the step's first sample)."""
    enc = _Encoder(view)
    samples = [enc.sample(s) for s in view.samples]
    return {
        "step": view.step,
        "validate": view.validate,
        "source": source,
        "jaeger": jaeger_ui_base(jaeger_ui),
        "span_ms": enc.ms(view.t1_ns),
        "phases": enc.phases,
        "counts": view.counts,
        "verdicts_from": view.verdicts.source if view.verdicts is not None else "none",
        "names": enc.strings.items,
        "samples": samples,
        "engine": any(b.engine for s in view.samples for b in s.bars),
        "engines": [e.to_json(view.t0_ns) for e in view.engines],
    }


def render_html(view: StepView, *, source: str = "", jaeger_ui: str | None = None) -> str:
    """The page as one string."""
    title = f"step {view.step}{' (validation)' if view.validate else ''}: {len(view.samples)} samples"
    return fill(
        _PAGE,
        title=title,
        css=asset("timeline.css"),
        js=asset("timeline.js"),
        data=page_data(view, source=source, jaeger_ui=jaeger_ui),
    )


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
<div id="rows"><div id="grid"></div></div><div id="engines"></div></div></section>
<aside><div id="hists"></div><div id="detail"><p class="hint">Click a row to see that sample's waterfall.</p></div>
</aside></main>
<div id="tip" hidden></div>
<script id="timeline-data" type="application/json">%DATA%</script>
<script>%JS%</script>
</body></html>
"""
)
