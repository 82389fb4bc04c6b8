"""Step summaries read from anywhere (a file, a trace folder, Jaeger) are untrusted: each ``rl.step.summary`` span
is checked as it is read (:func:`checked`), and one that fails is left out of everything, counted, with the first
reason in one stderr line (:func:`skipped_line`). A summary is read only when its text parses as a
``StepSummary`` (``StepSummary.from_json``: types, counts and seconds not negative, times in order) and names the
same step as its span's ``rl.step``/``rl.validate`` (the writer sets both): garbage never counts as a step, and a
summary never stands in for another step."""

from __future__ import annotations

from collections.abc import Iterable

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import StepSummary
from ._decode import Skipped


def read_summary(rec: SpanRecord) -> StepSummary:
    """The summary of one ``rl.step.summary`` span; raises ``ValueError`` saying why it cannot be read."""
    text = rec.attributes.get(sc.RL_STEP_SUMMARY)
    if not isinstance(text, str):
        raise ValueError(f"no {sc.RL_STEP_SUMMARY} text")
    summary = StepSummary.from_json(text)
    step, validate = sc.step_key(rec.attributes)
    if (step, validate) != (summary.step, summary.validate):
        raise ValueError(
            f"its span says step {step}{' (validation)' if validate else ''}, its summary step "
            f"{summary.step}{' (validation)' if summary.validate else ''}"
        )
    return summary


def checked(records: Iterable[SpanRecord], skipped: Skipped) -> list[SpanRecord]:
    """``records`` without the summary spans :func:`read_summary` cannot read; each left out is counted in
    ``skipped`` (the first reason kept, with the span's trace id)."""
    out: list[SpanRecord] = []
    for rec in records:
        if rec.name == sc.STEP_SUMMARY_SPAN:
            try:
                read_summary(rec)
            except ValueError as exc:
                skipped.add(f"trace {rec.trace_id_hex}: {str(exc)[:200]}")
                continue
        out.append(rec)
    return out


def skipped_line(skipped: Skipped, source: str) -> str:
    """One line for stderr (``""`` when none was skipped): how many summaries were left out, and why."""
    if not skipped.count:
        return ""
    what = "step summary" if skipped.count == 1 else "step summaries"
    return (
        f"skipped {skipped.count} unreadable {what} in {source} (first: {skipped.first}); a step is never read "
        "from one: its spans are read instead where they were"
    )
