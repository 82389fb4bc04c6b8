"""``report``'s command line as typed values: :class:`ReportOptions`, made from the flags in one place
(``_report_args.options_of``) and read by every view (``_report.VIEWS``); no view reads an argparse namespace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..analysis._reading._options import JaegerOptions, StepOptions
from ..analysis._reading._source import JaegerSource

Mode = Literal["runs", "run", "compare", "step"]
"""The view ``report`` runs: the runs in the source (``--runs``), one run step by step (``--run``), two steps
side by side (``--compare``), or one step (the default); the first of these its flags ask for."""


@dataclass(frozen=True)
class Outputs:
    """What ``report`` prints and writes besides its terminal lines; every field has a default."""

    as_json: bool = False
    """``--json``: print JSON instead of tables."""
    html: str | None = None
    """``--html``: the page to write (the step's timeline page, the comparison page or the run page); ``None``:
    none."""
    png: str | None = None
    """``--png``: the drawn sample's waterfall as a PNG; ``None``: none."""
    timeline_png: str | None = None
    """``--timeline-png``: the step's timeline as a PNG; ``None``: none."""
    perfetto: str | None = None
    """``--perfetto``: the step as a Chrome Trace Event Format file; ``None``: none."""
    jaeger_ui: str | None = None
    """``--jaeger-ui``: link the pages' trace ids to the Jaeger UI at this URL; ``None``: to each sample's
    waterfall on the step's own timeline page."""


@dataclass(frozen=True)
class RunOptions:
    """What ``report --run`` shows of a run; every field has a default."""

    steps: tuple[int | None, int | None] | None = None
    """``--steps``: only the steps from the first to the last (inclusive; ``None`` at either end: open);
    ``None``: every step."""
    step_pages: int | None = None
    """``--step-pages``: timeline pages for at most this many steps beside the run page; ``None``:
    ``_run.DEFAULT_STEP_PAGES`` when the steps' spans were read or are cheap to read, else 0."""


@dataclass(frozen=True)
class ReportOptions:
    """One ``report`` command: its view, where it reads, which step, and what it writes."""

    mode: Mode
    """The view to run (see :data:`Mode`)."""
    source: str | JaegerOptions
    """Where to read: a trace file's or trace folder's path (``--file``), or Jaeger (``--jaeger``)."""
    step: StepOptions = field(default_factory=StepOptions)
    """The step (``--step``, ``--validate``), its run (``--run-id``) and sample (``--sample``, ``--rollout``),
    how many slowest samples (``--top``), and whether its spans are needed."""
    compare: tuple[int, int] | None = None
    """``--compare A B``: the two steps compared; ``None`` outside :data:`Mode` ``compare``."""
    out: Outputs = field(default_factory=Outputs)
    """What is printed and written."""
    run: RunOptions = field(default_factory=RunOptions)
    """With ``--run``: which steps, how many timeline pages."""

    @property
    def file(self) -> str | None:
        """The trace file's or folder's path; ``None`` when reading Jaeger."""
        return self.source if isinstance(self.source, str) else None

    @property
    def jaeger(self) -> JaegerOptions | None:
        """The Jaeger read; ``None`` when reading a file or folder."""
        return None if isinstance(self.source, str) else self.source

    @property
    def jaeger_url(self) -> str:
        """Jaeger's URL as given, for a line saying it could not be asked (``""`` for a file)."""
        return "" if isinstance(self.source, str) else self.source.url


View = Callable[[ReportOptions, JaegerSource | None], int]
"""A view: the options and the Jaeger source opened for them (``None`` for a file); the exit status."""
