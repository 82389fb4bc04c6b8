"""Where ``report --jaeger`` reads, and what ``report`` says when it finds nothing.

The services: ``--service``; else ``OTEL_SERVICE_NAME`` when set (the name the traced program used); else every
service Jaeger lists whose operations include ours (a span name starting ``rl.``: the sample and step-summary
spans; one small ``/api/v3/operations`` call per service). The window: ``--since`` back from now; else all that
Jaeger stores (``api_v3`` needs a time range: from the Unix epoch to a day from now covers any retention and a
clock ahead of this one; a full page is still split in time, see :meth:`JaegerClient.find_all_traces`).

A "nothing found" line names what was searched and what exists (services, runs, steps), never just "none".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from ... import semconv as sc
from ...config import _local_stack
from ...config._environment import variable
from ...metrics._records import SpanRecord
from ._decode import Skipped, decode_resource_spans
from ._http import JaegerUnreachableError
from ._jaeger import JaegerClient, JaegerError, Search, TraceQuery
from ._jaeger_step import StepReader, expected_samples, read_all
from ._opensearch import IndexQuery
from ._options import JaegerOptions
from ._runs import Run, RunKey, group_runs, run_key, steps_text
from ._text import printable

EPOCH = datetime(1970, 1, 2, tzinfo=timezone.utc)
"""Where a search without ``--since`` starts: everything Jaeger keeps, whatever its retention. A day after the Unix
epoch: Jaeger's OpenSearch/Elasticsearch reader searches from a day before the start, in unsigned microseconds, and
from 1970-01-01 that wraps around and finds nothing (Jaeger v2.13)."""
CLOCK_SLACK = timedelta(days=1)
"""How far past now a search ends (spans stamped by a host whose clock runs ahead)."""
STEP_WINDOW_SLACK = timedelta(seconds=30)
"""How far a step's window reaches past its ``rl.step`` and summary spans (a worker's clock ahead or behind)."""
ENGINE_LOAD_REACH = timedelta(seconds=60)
"""How far before a step's window its engines' ``rl.engine.load`` spans are searched (a window that began before
the step: the integration closes one every 10 s of points, at most 600 points of 100 ms)."""
STEP_SEARCH_DEPTH = 10_000
"""Traces one search of a step's window, or of a run's step or summary spans, asks for (``--search-depth`` when
larger): a step of 8,192 samples in one search (4.8 s from Badger) instead of pages of 500, each page's window
split and searched again (37 s).
Jaeger's OpenSearch/Elasticsearch reader caps a search at ``max_doc_count``, 10,000 by default; a fuller window
is still split, never cut."""
_ONE_PER_STEP = (sc.STEP_SPAN, sc.STEP_SUMMARY_SPAN)
"""Operations whose search uses :data:`STEP_SEARCH_DEPTH` too, made once per service and operation
(:meth:`JaegerSource.one_per_step`): a run of 1,000 steps has 1,000 summaries, read in one search instead of
pages of 500, each split and searched again (OpenSearch fetches every trace of every page: ``report --step`` on
the store soak's 2.6 M spans took 9.1 s with the summaries in pages of 500, 1.5 s in one search)."""
MAX_LISTED = 8
"""The most services or runs one line lists (then ``and N more``)."""
OUR_PREFIX = sc.SPAN_NAME_PREFIX
"""A service is ours when one of its operations (span names) starts with this (``rl.sample``, ``rl.step.summary``)."""


class NothingFoundError(LookupError):
    """The source holds nothing ``report`` can read; the message says what was searched and what exists."""


def listed(names: Sequence[str], limit: int = MAX_LISTED) -> str:
    """``a, b, c and 4 more`` (each printable and cut), or ``none``."""
    if not names:
        return "none"
    shown = ", ".join(printable(n, max_chars=80) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def runs_text(records: Iterable[SpanRecord]) -> str:
    """What ``records`` hold, for a "nothing found" line: ``runs: ID (service S; steps 1, 2; validation: 2), ...``."""
    runs = group_runs(records)
    if not runs:
        return "it holds no spans"
    parts = [f"{printable(r.label, max_chars=80)} (service {printable(r.service, 80)}; steps {steps_text(r.steps())})"
             for r in runs[-MAX_LISTED:]]  # fmt: skip
    more = f" and {len(runs) - MAX_LISTED} older" if len(runs) > MAX_LISTED else ""
    return f"runs: {'; '.join(parts)}{more}"


def jaeger_error_line(exc: JaegerError, url: str) -> str:
    """The one line for a Jaeger that could not be asked: short, with what to check."""
    if isinstance(exc, JaegerUnreachableError):
        return (
            f"cannot query Jaeger at {printable(url, max_chars=200)}: {printable(str(exc).rpartition(': ')[2])}; is "
            "it running? (`make up` starts one; --jaeger is its query URL, e.g. http://127.0.0.1:16686)"
        )
    return f"cannot query Jaeger: {printable(exc, max_chars=400)}"


@dataclass
class JaegerSource:
    """The services and window one ``report --jaeger`` reads; :meth:`search` fetches their spans."""

    client: JaegerClient
    services: list[str]
    chosen_by: str
    since_minutes: float | None
    search_depth: int
    all_services: list[str] | None = None
    """Every service Jaeger lists, once asked (the default choice asks; a "nothing found" line asks then)."""
    ours: list[str] = field(default_factory=list)
    run: Run | None = None
    """The run read, once chosen from the step summaries (``_jaeger_run``): a step's window is then its step's."""
    _step_times_cache: dict[tuple[str, RunKey | None], dict[int, tuple[int, int]] | None] = field(
        default_factory=dict, repr=False
    )
    _one_per_step_cache: dict[tuple[str, str], Search] = field(default_factory=dict, repr=False)
    progress: Callable[[str], None] = field(default=lambda _line: None, repr=False)
    """Where what a read does and how far it got go (stderr lines; ``open_jaeger`` sets its ``note``)."""
    index: IndexQuery | None = None
    """The OpenSearch that Jaeger stores in, when known (``--opensearch``, or the local stack's)."""
    index_named: bool = False
    """``index`` was named (``--opensearch``): a store that does not answer there is said."""
    steps: StepReader = field(init=False, repr=False)
    """How a step's traces are read (``_jaeger_step``: by ``rl.step`` from the store or over gRPC, else the
    window over HTTP)."""

    def __post_init__(self) -> None:
        self.steps = StepReader(self.client, self.index, self.index_named, lambda line: self.progress(line))

    @property
    def label(self) -> str:
        return f"{self.client.base_url} (service {', '.join(self.services)})"

    def window(self) -> tuple[datetime, datetime]:
        now = datetime.now(timezone.utc)
        if self.since_minutes is None:
            return EPOCH, now + CLOCK_SLACK
        return now - timedelta(minutes=self.since_minutes), now + CLOCK_SLACK

    def window_text(self) -> str:
        if self.since_minutes is None:
            return "all it stores"
        return f"the last {self.since_minutes:g} min (--since)"

    def search(
        self, warn: Callable[[str], None], operation: str | None = None, step: int | None = None
    ) -> list[SpanRecord]:
        """The spans of every chosen service in the window (only ``operation`` spans, only step ``step``, when
        given); a full page that could not be split, and malformed records, are reported through ``warn``.

        For a step's spans the window is first narrowed to the step's own time (:meth:`step_window`): the
        search then reads that step's traces, not every trace the store keeps."""
        start, end = self.window()
        attributes = {sc.RL_STEP: str(step)} if step is not None else None
        records: list[SpanRecord] = []
        skipped = Skipped()
        for service in self.services:
            lo, hi, depth = start, end, self.search_depth
            if operation in _ONE_PER_STEP:  # small traces, one or two a step: a run's in one search
                depth = max(depth, STEP_SEARCH_DEPTH)
            if step is not None and operation is None:
                lo, hi = self.step_window(service, step, start, end)
                if (lo, hi) != (start, end):  # one step's traces: one search, not a page of 500 at a time
                    depth = max(depth, STEP_SEARCH_DEPTH)
            if operation in _ONE_PER_STEP and step is None:  # the search a step's window shares
                found = self.one_per_step(service, operation, start, end)
            elif step is not None and operation is None:  # only the step's traces where Jaeger can say which
                if self.steps.targeted():  # the step's traces alone: one search
                    depth = max(depth, STEP_SEARCH_DEPTH)
                expected, named = self._expected(service, step), len(self.services) > 1
                found = self.steps.read(service, step, (lo, hi), depth, self.progress, expected, named=named)
            else:  # progress on stderr: the whole store may take minutes
                search = TraceQuery(service, lo, hi, attributes, operation, depth)
                found = read_all(self.client, self.progress, search, self.steps.store())
            if found.full:
                warn(f"service {service}: {found.left_out(depth)}")
            records += decode_resource_spans(found.resource_spans, skipped)
            if step is not None and operation is None and (lo, hi) != (start, end):
                records += self._engine_load(service, lo, hi, records, warn, skipped)
        if skipped.count:
            warn(skipped.summary(self.label))
        return records

    def _engine_load(
        self,
        service: str,
        lo: datetime,
        hi: datetime,
        have: list[SpanRecord],
        warn: Callable[[str], None],
        skipped: Skipped,
    ) -> list[SpanRecord]:
        """``service``'s ``rl.engine.load`` spans (an engine's load, with or without ``rl.step``) that start in a
        step's window ``[lo, hi]`` widened back by :data:`ENGINE_LOAD_REACH` (a window that began before the step),
        less those already in ``have``: the engine's load under the step (``_engine_load``)."""
        store = self.steps.store()
        found = self.client.find_all_traces(
            service,
            lo - ENGINE_LOAD_REACH,
            hi,
            operation=sc.ENGINE_LOAD_SPAN,
            search_depth=self.search_depth,
            finder=store.find_traces if store is not None else None,
        )
        if found.full:
            warn(f"service {service}: {found.left_out(self.search_depth)}")
        seen = {(r.trace_id, r.span_id) for r in have if r.name == sc.ENGINE_LOAD_SPAN}
        return [r for r in decode_resource_spans(found.resource_spans, skipped) if (r.trace_id, r.span_id) not in seen]

    def start_step(self, step: int) -> None:
        """Send the search of step ``step``'s traces (every chosen service's, over the whole window: every run's
        step ``step``) now, where Jaeger's gRPC query API answers (:meth:`StepReader.start`): Jaeger reads them
        while the run's summaries are read and the step's window is found; :meth:`search` for the step reads its
        answer (the run's own spans are kept after: ``_jaeger_run.run_records``)."""
        start, end = self.window()
        depth = max(self.search_depth, STEP_SEARCH_DEPTH)
        for service in self.services:
            self.steps.start(service, step, (start, end), depth)

    def close(self) -> None:
        """Finish the searches :meth:`start_step` sent that no read took (their answers dropped)."""
        self.steps.close()

    def step_window(self, service: str, step: int, start: datetime, end: datetime) -> tuple[datetime, datetime]:
        """The part of [start, end] where step ``step``'s traces start: from its ``rl.step`` spans (the trainer's
        step, trainer phases inside) and its ``rl.step.summary`` spans (their start is the step's first sample's
        start, their end its collection), widened by :data:`STEP_WINDOW_SLACK` (clocks of other hosts); [start,
        end] itself when neither is found (traces without them) or either search is incomplete. The two small
        searches by operation name, which every Jaeger filters on (Jaeger 2.13's HTTP api_v3 ignores
        ``query.attributes``, so a tag alone does not narrow a search), run once per service (over the window of
        the first step read) and serve every step read from this source (a run page's step pages, ``--compare``)."""
        times = self._step_times(service, start, end)
        if times is None or step not in times:
            return start, end
        first_ns, last_ns = times[step]
        lo = datetime.fromtimestamp(first_ns / 1e9, timezone.utc) - STEP_WINDOW_SLACK
        hi = datetime.fromtimestamp(last_ns / 1e9, timezone.utc) + STEP_WINDOW_SLACK
        return max(lo, start), min(hi, end)

    def _step_times(self, service: str, start: datetime, end: datetime) -> dict[int, tuple[int, int]] | None:
        """Each step's (first start, last end) of its ``rl.step`` and summary spans in [start, end]; ``None`` when
        either search is incomplete. Only :attr:`run`'s, once chosen. Cached per service and run: ``window()``
        moves with the clock between calls."""
        run = self.run.key if self.run is not None else None
        cache = (service, run)
        if cache in self._step_times_cache:
            return self._step_times_cache[cache]
        times: dict[int, tuple[int, int]] = {}
        for operation in _ONE_PER_STEP:
            found = self.one_per_step(service, operation, start, end)
            if found.full:
                self._step_times_cache[cache] = None
                return None
            for rec in decode_resource_spans(found.resource_spans, Skipped()):
                step = sc.step_key(rec.attributes)[0]
                if rec.name != operation or step is None or rec.start_ns <= 0:
                    continue
                if run is not None and run_key(rec.resource) != run:
                    continue
                first, last = times.get(step, (rec.start_ns, rec.end_ns))
                times[step] = (min(first, rec.start_ns), max(last, rec.end_ns, rec.start_ns))
        self._step_times_cache[cache] = times
        return times

    def _expected(self, service: str, step: int) -> int | None:
        """The samples step ``step`` counts in :attr:`run`'s summaries, when they were searched (for progress)."""
        found = self._one_per_step_cache.get((service, sc.STEP_SUMMARY_SPAN))
        if found is None:
            return None
        records = list(decode_resource_spans(found.resource_spans, Skipped()))
        return expected_samples(records, self.run.key if self.run is not None else None, step)

    def one_per_step(self, service: str, operation: str, start: datetime, end: datetime) -> Search:
        """Every ``operation`` trace (one of :data:`_ONE_PER_STEP`) of ``service`` in [start, end], in searches of
        :data:`STEP_SEARCH_DEPTH`; made once per service and operation and kept (``window()`` moves with the
        clock between calls), so that a step's window and the summaries a report reads share one search."""
        key = (service, operation)
        if key not in self._one_per_step_cache:
            depth = max(self.search_depth, STEP_SEARCH_DEPTH)
            store = self.steps.store()  # the store's indices: Jaeger on OpenSearch fetches a trace per search
            finder = store.find_traces if store is not None else None
            self._one_per_step_cache[key] = self.client.find_all_traces(
                service, start, end, operation=operation, search_depth=depth, finder=finder
            )
        return self._one_per_step_cache[key]

    def nothing(self, what: str) -> str:
        """``what`` (``no sample spans``) with what was searched and which services Jaeger has."""
        try:
            if self.all_services is None:
                self.all_services = sorted(self.client.services())
            others = [s for s in self.all_services if s not in self.services]
            exists = f"Jaeger lists services: {listed(others)} besides {listed(self.services)}"
        except JaegerError:
            exists = "Jaeger's service list could not be read"
        return (
            f"{what} found in Jaeger {printable(self.client.base_url, 200)} for service {listed(self.services)} "
            f"({self.chosen_by}) over {self.window_text()}; {exists}"
        )


def open_jaeger(options: JaegerOptions, note: Callable[[str], None]) -> JaegerSource:
    """The Jaeger source ``options`` name; ``note`` gets one line saying which services are read when
    :attr:`~JaegerOptions.service` does not name one. Raises :class:`JaegerError`, or :class:`NothingFoundError`
    when no service has agent-loop spans."""
    client = JaegerClient(options.url, timeout_s=options.timeout_s)
    url, named = options.opensearch, True
    if url is None and options.url == _local_stack.jaeger_url(variable(_local_stack.VARIABLE)):
        url, named = _local_stack.opensearch_url(variable(_local_stack.VARIABLE)), False  # if it runs on one
    index = IndexQuery(url, options.opensearch_index, options.timeout_s) if url else None
    source = JaegerSource(
        client, [], "", options.since_minutes, options.search_depth, progress=note, index=index, index_named=named
    )
    if options.service:
        source.services, source.chosen_by = [options.service], "--service"
        return source
    env = variable("OTEL_SERVICE_NAME") or ""
    if env:
        source.services, source.chosen_by = [env], "from OTEL_SERVICE_NAME"
        note(f"reading service {printable(env, 200)} (OTEL_SERVICE_NAME; --service picks another)")
        return source
    source.all_services = sorted(client.services())
    source.services = [s for s in source.all_services if any(op.startswith(OUR_PREFIX) for op in client.operations(s))]
    source.chosen_by = "every service with agent-loop spans"
    if not source.services:
        raise NothingFoundError(
            f"no sample spans found in Jaeger {printable(client.base_url, 200)}: no service has agent-loop spans "
            f"({OUR_PREFIX}* span names); services: {listed(source.all_services)}"
        )
    note(
        f"reading {'service' if len(source.services) == 1 else 'services'} {listed(source.services)} from Jaeger "
        f"(every service with agent-loop spans; --service or OTEL_SERVICE_NAME picks one), over "
        f"{source.window_text()}"
    )
    return source
