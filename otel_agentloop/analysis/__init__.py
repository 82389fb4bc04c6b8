"""Spans after the fact: reading stored traces (OTLP-JSON files, trace folders, Jaeger) and rebuilding a step's
metrics (``_reading``), and rendering them (``_rendering``: terminal tables, waterfalls, the step timeline page and
PNG, the run and compare pages, Perfetto). Rendering reads through ``_reading``; ``_reading`` never imports
``_rendering`` (an import-linter contract)."""

from ._reading._decode import Skipped, decode_resource_spans, read_jsonl
from ._reading._jaeger import JaegerClient, JaegerError
from ._reading._report import StepReport, build_report
from ._reading._step_view import StepView, build_step_view
from ._reading._store import read_traces
from ._reading._timeline import TimelineRecorder
from ._rendering._timeline_html import write_html
from ._rendering._timeline_png import render_timeline_png
from ._rendering._waterfall import render_png, render_text

__all__ = [
    "JaegerClient",
    "JaegerError",
    "Skipped",
    "StepReport",
    "StepView",
    "TimelineRecorder",
    "build_report",
    "build_step_view",
    "decode_resource_spans",
    "read_jsonl",
    "read_traces",
    "render_png",
    "render_text",
    "render_timeline_png",
    "write_html",
]
