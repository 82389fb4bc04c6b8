"""Spans after the fact: reading stored traces (OTLP-JSON files, Jaeger), rebuilding a step's metrics, and
rendering (terminal tables, waterfalls, the step timeline page and PNG)."""

from ._decode import Skipped, decode_resource_spans, read_jsonl
from ._jaeger import JaegerClient, JaegerError
from ._report import StepReport, build_report
from ._step_view import StepView, build_step_view
from ._store import read_traces
from ._timeline import TimelineRecorder
from ._timeline_html import write_html
from ._timeline_png import render_timeline_png
from ._waterfall import render_png, render_text

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
