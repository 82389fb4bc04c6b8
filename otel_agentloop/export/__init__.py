"""Getting spans out without stalling training: the bounded export processor, trace budgets, keeping the
slowest and failed samples, OTLP-JSON encoding, and the file and HTTP exporters."""

from ._file import OTLPJsonFileExporter
from ._http_json import OTLPJsonHttpExporter

__all__ = ["OTLPJsonFileExporter", "OTLPJsonHttpExporter"]
