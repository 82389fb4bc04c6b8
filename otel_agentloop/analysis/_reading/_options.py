"""What a reading view is asked, as typed values: which Jaeger and how to search it (:class:`JaegerOptions`),
which step and what of it (:class:`StepOptions`). The views take these, never a command line: the CLI maps its
flags onto them in one place (``cli._report_args.options_of``); a program builds them itself."""

from __future__ import annotations

from dataclasses import dataclass

from ._opensearch import DEFAULT_INDEX

DEFAULT_SEARCH_DEPTH = 500
"""Traces one Jaeger search asks for by default (below Jaeger's limit; a full page is split in time)."""
DEFAULT_TIMEOUT_S = 10.0
"""Seconds one Jaeger call may take by default (a search for N > 1000 traces: N/1000 times that)."""


@dataclass(frozen=True)
class JaegerOptions:
    """Which Jaeger to read and how to search it (``_source.open_jaeger``); every field but ``url`` has a
    default."""

    url: str
    """Jaeger's query URL (``http://127.0.0.1:16686``). The local stack's (``config._local_stack``) also tries the
    local stack's OpenSearch when :attr:`opensearch` is ``None``."""
    service: str | None = None
    """The one service to read; ``None``: ``OTEL_SERVICE_NAME`` when set, else every service with agent-loop
    spans."""
    since_minutes: float | None = None
    """Read only the traces of the last this many minutes; ``None``: all that Jaeger stores."""
    search_depth: int = DEFAULT_SEARCH_DEPTH
    """Traces per search (a full page is split in time and searched again)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Seconds per Jaeger (or OpenSearch) call."""
    opensearch: str | None = None
    """The OpenSearch (or Elasticsearch) URL Jaeger stores in, read straight for a step's traces (a store that
    does not answer there is said); ``None``: none named (the local stack's is still tried, see :attr:`url`)."""
    opensearch_index: str = DEFAULT_INDEX
    """Jaeger's span indices in :attr:`opensearch` (its index prefix + ``jaeger-span-*``)."""


@dataclass(frozen=True)
class StepOptions:
    """Which step a view reads and what of it is asked (``_stored_step.from_summary``, the CLI's step and compare
    views); every field has a default."""

    number: int | None = None
    """The step; ``None``: the last step found."""
    validate: bool = False
    """The step's validation pass, not its training step."""
    run_id: str | None = None
    """The run's ``rl.run.id``; ``None``: the latest run (the one that started last)."""
    sample: int | None = None
    """The sample index to draw; ``None``: the slowest sample."""
    rollout: int = 0
    """With :attr:`sample`: the rollout to draw."""
    top: int = 5
    """How many slowest samples to list."""
    all_failed: bool = False
    """The answer must list every failed sample (``report --json`` does), not just those a summary keeps."""
    spans: bool = False
    """Every sample's spans are needed whatever the stored summary holds (rebuilding from spans, a page, a
    Perfetto file, a comparison): the summary alone never answers."""
