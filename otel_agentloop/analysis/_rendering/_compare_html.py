"""The comparison page (``report --compare A B --html FILE``): one self-contained HTML file, nothing fetched.

It shows the cause first, then both step times split at the median sample, the tails' phase mix as stacked bars,
the per-phase and per-tool table side by side with deltas, and the samples that moved most (linked to Jaeger when
an http(s) UI base is given). Safety as on the timeline page: the data is :meth:`Comparison.to_json` in a
``<script type="application/json">`` block with ``<``, ``>``, ``&`` escaped, and the script writes every string
through ``textContent``/``setAttribute``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._reading._json import dig
from ._assets import asset
from ._html import HEAD, fill, jaeger_ui_base, write_page


def render_compare_html(
    data: Mapping[str, object],
    *,
    source: str = "",
    jaeger_ui: str | None = None,
    pages: Mapping[str, str] | None = None,
) -> str:
    """The page as one string; ``data`` is ``Comparison.to_json()``. A trace id links to the Jaeger UI at
    ``jaeger_ui`` when given, else to its waterfall on the step's timeline page ``pages["a"]``/``pages["b"]``
    (relative paths), else is plain text."""
    a_step, b_step, validate = dig(data, "a", "step"), dig(data, "b", "step"), dig(data, "a", "validate")
    title = f"step {a_step} vs step {b_step}{' (validation)' if validate else ''}"
    page_data = {"source": source, "jaeger": jaeger_ui_base(jaeger_ui), "pages": dict(pages or {}), **data}
    return fill(_PAGE, title=title, css=asset("compare.css"), js=asset("compare.js"), data=page_data)


def write_compare_html(
    data: Mapping[str, object],
    path: str | os.PathLike[str],
    *,
    source: str = "",
    jaeger_ui: str | None = None,
    pages: Mapping[str, str] | None = None,
) -> str:
    """Write the page to ``path``; returns the path."""
    return write_page(path, render_compare_html(data, source=source, jaeger_ui=jaeger_ui, pages=pages))


_PAGE = (
    HEAD
    + """<body>
<header><h1 id="title"></h1><div id="source"></div></header>
<main>
<div id="cause"></div>
<section><h2>Step time</h2><div id="steptime"></div></section>
<section><h2>The tail: mean seconds per sample of the slowest samples</h2><div id="tail"></div></section>
<section><h2>Per phase (seconds per sample) and per tool (seconds per call)</h2>
<table id="stats"><thead></thead><tbody></tbody></table></section>
<section><h2>Samples that moved most</h2><table id="moved"><thead></thead><tbody></tbody></table>
<p id="only"></p></section>
<ul id="notes"></ul>
</main>
<script id="compare-data" type="application/json">%DATA%</script>
<script>%JS%</script>
</body></html>
"""
)
