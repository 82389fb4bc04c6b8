"""Settings: defaults, the standard ``OTEL_*`` and ``OTEL_AGENTLOOP_*`` environment, validation. Imports
nothing else of this package."""
