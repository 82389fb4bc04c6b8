"""The per-span hot path: tracer lookup, the record (``_record.FastSpan``) and recorder, the door between records
and SDK spans (``_door``), the one span lifecycle every wrapper and integration uses (``_lifecycle``), step and
sample scopes, the content policy, the in-flight registry and the process state. Imports nothing else of this
package but :mod:`otel_agentloop.config`, :mod:`otel_agentloop.semconv` and the version; its public names are
re-exported by :mod:`otel_agentloop`."""
