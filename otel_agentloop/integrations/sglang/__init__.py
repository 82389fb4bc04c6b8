"""SGLang: its output reader and request wrapper, used by every integration that reaches SGLang (verl's
``SGLangHttpServer``; your own code calling SGLang's ``TokenizerManager``).

- :func:`output_attributes`: the turn attributes of one finished SGLang output (the dict SGLang's
  ``generate_request`` yields: ``meta_info`` with ``id``, ``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, ``finish_reason``, ``num_retractions``, and with SGLang's ``enable_metrics`` its timing:
  ``queue_time``, ``first_token_latency``, ``forward_entry_time``, ``prefill_finished_time``,
  ``request_finished_ts``). :func:`record_output` puts them on the turn span.
- :func:`with_trace_header`: a ``GenerateReqInput`` carrying the turn's W3C headers in SGLang's
  ``external_trace_header`` (unless already set), so SGLang's own request span (``enable_trace``) joins the
  sample's trace.

SGLang is never imported here: outputs and requests are read and written by attribute and key. Nothing raises
into the caller (an error is logged once).
"""

from __future__ import annotations

from ._output import output_attributes, record_output
from ._wrappers import GenerateRequest, with_trace_header

__all__ = ["GenerateRequest", "output_attributes", "record_output", "with_trace_header"]
