"""Reading one step's traces from Jaeger: only that step's, with progress on stderr.

A step's spans carry ``rl.step``; its traces are found by that attribute, within the step's window
(``JaegerSource.step_window``), so that neighbouring steps' traces in the same window are never fetched: a
64-sample step beside an 8,192-sample one costs 64 traces, not 8,000. Where Jaeger stores in OpenSearch and that
answers (``--opensearch``), straight from its span indices (:mod:`._opensearch`: Jaeger's own search there costs a
search per trace); else through Jaeger's api_v3 over gRPC (:mod:`._jaeger_grpc`: Jaeger 2.13's HTTP API ignores
attribute filters). Where neither answers (a proxy in front of the HTTP port only, a Jaeger without gRPC), the
window is read over HTTP as before (every trace in it; the report then keeps the step's spans), with one line
saying so.

A step read that takes longer than :data:`PROGRESS_EVERY_S` says on stderr how it reads (and how many samples the
step's summary counts), how far it got every :data:`PROGRESS_EVERY_S`, and what it read (traces, searches, seconds)
(:class:`Ticker`); a quicker one prints nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ._jaeger import Finder, JaegerClient, JaegerError, ResourceSpans, Search, TraceQuery, trace_ids
from ._jaeger_grpc import GrpcQuery, Started, grpc_target
from ._opensearch import IndexQuery
from ._report import stored_summaries
from ._runs import RunKey, run_key
from ._text import printable

PROGRESS_EVERY_S = 2.0
"""How often a step read that is still running says how far it got."""

Note = Callable[[str], None]


@dataclass
class Ticker:
    """Progress lines of one read, quiet while it is quick: once it has run :data:`PROGRESS_EVERY_S`, the
    ``opening`` lines (what it reads), then how far it got at most every :data:`PROGRESS_EVERY_S` (:meth:`tick`),
    and at the end (:meth:`done`) what it read; a read done sooner prints nothing."""

    note: Note
    what: str
    opening: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    base: int = 0
    """Traces read by the searches before the current one."""
    _last: float = 0.0
    said: bool = False
    """Whether it has printed (its opening lines)."""

    def __post_init__(self) -> None:
        self._last = self.started

    def _open(self) -> None:
        if not self.said:
            self.said = True
            for line in self.opening:
                self.note(line)

    def tick(self, traces: int) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            self._open()
            self.note(f"{self.what}: {_traces(self.base + traces)} read so far ({now - self.started:.1f} s)")

    def done(self, found: Search) -> None:
        if self.said or self.elapsed_s >= PROGRESS_EVERY_S:
            self._open()
            searches = "1 search" if found.searches == 1 else f"{found.searches:,} searches"
            self.note(f"{self.what}: {_traces(found.traces)} read in {self.elapsed_s:.1f} s ({searches})")

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


def _traces(n: int) -> str:
    return "1 trace" if n == 1 else f"{n:,} traces"


@dataclass
class StepReader:
    """How one ``report`` reads steps from ``client``, the quickest way that answers, probed once:

    1. ``index``: the OpenSearch (or Elasticsearch) that this Jaeger stores in (:mod:`._opensearch`, ``--opensearch``;
       the local stack's when ``report --jaeger`` reads the local stack), when its span indices hold every service
       Jaeger lists (the same store, not a neighbour's);
    2. Jaeger's query gRPC port (:func:`~._jaeger_grpc.grpc_target`), by the step's attribute, when it answers and
       lists the services the HTTP port lists (the same Jaeger);
    3. else the step's window over HTTP.

    ``index_named``: the index was asked for by name (``--opensearch``), so a failed probe is said to ``note``,
    once."""

    client: JaegerClient
    index: IndexQuery | None = None
    index_named: bool = False
    note: Note = field(default=lambda _line: None, repr=False)
    _query: GrpcQuery | None = None
    _probed: bool = False
    _use_index: bool = False
    said_http: bool = False
    _started: dict[tuple[str, int], _StartedRead] = field(default_factory=dict, repr=False)
    """The searches :meth:`start` sent, by service and step, until a read takes them."""

    def _probe(self) -> None:
        if self._probed:
            return
        self._probed = True
        if self.index is not None:
            listed = self.index.services()
            jaeger = self._http_services()
            if listed is not None and set(jaeger) <= set(listed):
                self._use_index = True
                return
            if self.index_named:
                lacking = "its span indices lack services Jaeger lists"
                why = lacking if listed is not None else "it does not answer as OpenSearch"
                self.note(f"--opensearch {printable(self.index.target, 200)}: {why}; reading through Jaeger instead")
        target = grpc_target(self.client.base_url)
        if target is not None:  # the same Jaeger there: it lists the same services as the HTTP port
            query = GrpcQuery(target, self.client.timeout_s)
            listed = query.services()
            if listed is not None and sorted(listed) == sorted(self._http_services()):
                self._query = query
            else:
                query.close()

    def query(self) -> GrpcQuery | None:
        """Jaeger's gRPC query API, when steps are read there."""
        self._probe()
        return self._query

    def store(self) -> IndexQuery | None:
        """The store's indices, when Jaeger's searches are read there (any search: a step's, a run's summaries,
        the whole store's)."""
        self._probe()
        return self.index if self._use_index else None

    def targeted(self) -> bool:
        """Whether a step read fetches that step's traces alone (the index or gRPC; not the window over HTTP)."""
        return self.how != "http"

    @property
    def how(self) -> str:
        """How steps are read: ``"index"`` (the store's indices), ``"grpc"`` or ``"http"`` (the window)."""
        self._probe()
        return "index" if self._use_index else "grpc" if self._query is not None else "http"

    def start(self, service: str, step: int, window: tuple[datetime, datetime], depth: int) -> None:
        """Send the search of step ``step``'s traces of ``service`` in ``window`` (searches of ``depth``) now, over
        gRPC (nothing elsewhere): Jaeger finds and reads them (seconds for thousands of traces) while ``report``
        reads the run's summaries. The next :meth:`read` of that step takes its answer; :meth:`close` reads it
        to its end if none did."""
        query = self.query()
        if query is None or (service, step) in self._started:
            return
        lo, hi = window
        started = query.start(TraceQuery(service, lo, hi, {sc.RL_STEP: str(step)}, search_depth=depth))
        self._started[(service, step)] = _StartedRead(started, window, depth)

    def close(self) -> None:
        """Read every search sent by :meth:`start` and not read to its end (its answer dropped), then close the
        gRPC channel. Never cut: Jaeger 2.13 to 2.15 crash when a client stops reading a search's answer (their
        ``AggregateTraces`` calls on after the stream's end; fixed in 2.16)."""
        for started in self._started.values():
            started.search.drain()
        self._started.clear()
        if self._query is not None:
            self._query.close()
            self._query = None

    def _http_services(self) -> list[str]:
        try:
            return self.client.services()
        except JaegerError:
            return []

    def read(
        self,
        service: str,
        step: int,
        window: tuple[datetime, datetime],
        depth: int,
        note: Note,
        expected: int | None,
        *,
        named: bool = False,
    ) -> Search:
        """The traces of step ``step`` of ``service`` in ``window`` (searches of ``depth`` traces), or the answer of
        the search :meth:`start` sent for it when there is one (see :meth:`_started_answer`); ``note`` gets the
        progress lines (naming the service when ``named``); ``expected``: the samples the step's summary counts,
        when known."""
        self._probe()
        lo, hi = window
        what = f"step {step}" + (f" of service {printable(service, 80)}" if named else "")
        counted = f"; its summary counts {expected:,} samples" if expected is not None else ""
        opening = []
        by_step = f"its traces only, by {sc.RL_STEP}={step}"
        if self._use_index and self.index is not None:
            how = f"{by_step}, straight from Jaeger's store ({printable(self.index.target, 200)})"
        elif self._query is not None:
            how = f"{by_step} over Jaeger's gRPC query API ({self._query.target})"
        else:
            how = "every trace of its window over HTTP (neighbouring steps' too)"
            if not self.said_http:  # once, with the first slow read
                opening.append(
                    f"Jaeger's gRPC query API does not answer beside {printable(self.client.base_url, 200)} (at "
                    f"{grpc_target(self.client.base_url) or 'no port'}): a step's window is read whole over HTTP "
                    f"(Jaeger 2.13's HTTP API cannot search by {sc.RL_STEP}), which is slower"
                )
        opening.append(f"{what}: reading {how}{counted}")
        ticker = Ticker(note, what, opening)
        finder = _searches(ticker, self.index if self._use_index else self._query, self.client)
        started = self._started.pop((service, step), None)
        found = None
        if started is not None and self._query is not None:  # sent by start(): its answer, if it is complete
            found = self._started_answer(service, step, started, ticker)
        if found is None:
            found = self.client.find_all_traces(
                service, lo, hi, attributes={sc.RL_STEP: str(step)}, search_depth=depth, finder=finder
            )
        ticker.done(found)
        self.said_http = self.said_http or ticker.said
        return found

    def _started_answer(self, service: str, step: int, started: _StartedRead, ticker: Ticker) -> Search | None:
        """The answer of the search :meth:`start` sent for the step: every trace with its ``rl.step`` in the whole
        window, other runs' included (``report`` keeps its run's spans); ``None`` when it is a full page (it may
        have left some out: the step's own window is then searched, and split, as without it)."""
        assert self._query is not None
        page = self._query.collect(started.search, ticker.tick)
        if len(trace_ids(page)) >= started.depth:
            return None
        lo, hi = started.window
        return self.client.find_all_traces(
            service,
            lo,
            hi,
            attributes={sc.RL_STEP: str(step)},
            search_depth=started.depth,
            finder=_searches(ticker, None, self.client, answered=page),
        )


@dataclass
class _StartedRead:
    """A step's search sent by :meth:`StepReader.start`: its call, window and depth."""

    search: Started
    window: tuple[datetime, datetime]
    depth: int


def _searches(
    ticker: Ticker,
    query: GrpcQuery | IndexQuery | None,
    client: JaegerClient,
    *,
    answered: ResourceSpans | None = None,
) -> Finder:
    """A finder for ``find_all_traces`` that ticks ``ticker``: per trace streamed over gRPC, per batch of ids read
    from the store's indices, per search over HTTP; ``answered``: the answer of its one search, already read."""

    def find(search: TraceQuery) -> ResourceSpans:
        if answered is not None:
            page = answered
        elif query is not None:
            page = query.find_traces(search, progress=ticker.tick)
        else:
            page = client.search(search)
        ticker.base += len(trace_ids(page))
        ticker.tick(0)
        return page

    return find


def read_all(client: JaegerClient, note: Note, search: TraceQuery, store: IndexQuery | None = None) -> Search:
    """``client.find_all_traces`` of ``search`` (not one step's: a run's, the whole store's), from ``store`` (the
    store's indices) when given, saying how far it got every :data:`PROGRESS_EVERY_S` (between searches) and,
    when that took longer, what it read."""
    what = f"service {printable(search.service, 80)}"
    where = f"Jaeger's store {printable(store.target, 200)}" if store else f"Jaeger {printable(client.base_url, 200)}"
    ticker = Ticker(note, what, [f"{what}: searching {where} (every trace)"])
    s = search
    found = client.find_all_traces(
        s.service,
        s.start,
        s.end,
        attributes=s.attributes,
        operation=s.operation,
        search_depth=s.search_depth,
        finder=_searches(ticker, store, client),
    )
    ticker.done(found)
    return found


def expected_samples(summaries: list[SpanRecord], run: RunKey | None, step: int) -> int | None:
    """The samples step ``step`` (training or validation) of run ``run`` counts in its stored summaries, or
    ``None`` when it has none."""
    mine = [r for r in summaries if run is None or run_key(r.resource) == run]
    counts = [s.num_samples for (n, _), s in stored_summaries(mine).items() if n == step]
    return sum(counts) if counts else None
