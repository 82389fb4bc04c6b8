"""``report --compare A B``: print the comparison (terminal lines or JSON) and write its page."""

from __future__ import annotations

from collections.abc import Sequence

from .. import semconv as sc
from ..analysis._reading._comparison import Comparison, compare_steps
from ..analysis._reading._text import printable
from ..analysis._rendering._compare_html import write_compare_html
from ..analysis._rendering._compare_text import terminal_lines
from ..analysis._rendering._html import jaeger_ui_base
from ..analysis._rendering._terminal import say, say_json
from ..analysis._rendering._timeline_html import write_step_pages
from ..metrics._records import SpanRecord


def _step_pages(records: Sequence[SpanRecord], c: Comparison, html: str, source: str) -> dict[str, str]:
    """The two steps' timeline pages beside the comparison page (``cmp.html`` -> ``cmp.steps/``), where its trace
    ids link (each sample's waterfall); ``{"a": path, "b": path}`` for the steps with sample spans."""
    keys = {"a": (c.a.summary.step, c.a.summary.validate), "b": (c.b.summary.step, c.b.summary.validate)}
    spans = {k: [r for r in records if sc.step_key(r.attributes) == k] for k in set(keys.values())}
    written = write_step_pages(spans, html, source=source)
    return {side: written[key] for side, key in keys.items() if key in written}


def run_compare(
    records: Sequence[SpanRecord],
    step_a: int,
    step_b: int,
    *,
    validate: bool = False,
    top: int = 5,
    as_json: bool = False,
    html: str | None = None,
    source: str = "",
    jaeger_ui: str | None = None,
) -> int:
    """``report --compare A B``: print the comparison (or its JSON, alone on stdout), write the page; the exit
    status (1 with a one-line reason on stderr when a step is missing or the page cannot be written)."""
    from ..analysis._rendering._display import Output

    found = compare_steps(records, step_a, step_b, validate, top=top)
    if isinstance(found, str):
        say(f"report: {found}", err=True)
        return 1
    written = None
    if html:
        try:
            pages = {} if jaeger_ui_base(jaeger_ui) else _step_pages(records, found, html, source)
            written = write_compare_html(found.to_json(), html, source=source, jaeger_ui=jaeger_ui, pages=pages)
        except OSError as exc:
            say(
                f"report: cannot write --html {printable(html)}: {printable(exc.strerror or type(exc).__name__)}",
                err=True,
            )
            return 1
    if as_json:
        say_json(found.to_json(), indent=1, allow_nan=False)
        if written:
            say(f"comparison page written to {written}", err=True)
        return 0
    show = Output()
    for text, style in terminal_lines(found, source):
        show.line(text, style=style)
    if written:
        show.line(f"comparison page written to {written}")
    return 0
