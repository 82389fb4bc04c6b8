"""The handle's lifecycle events: one hook interface, fired by the metrics processor.

:class:`~._processor.PhaseMetricsProcessor` sees every step release and collect and is the provider's first
span processor, so it tells the handle's other parts (the sample keeper, the watchdog's monitor, the step
summary writer, the handle's export counters) what happened, through :class:`StepHooks`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._table import PhaseTable, StepMetrics


class StepHooks:
    """What a part of the handle hears from :class:`~._processor.PhaseMetricsProcessor` (register it with
    ``add_hooks``). Override the events you need: every default does nothing.

    Contract:

    - **When, which thread:** synchronously, on the thread of the call that fires the event, never on the span
      hot path (``on_start``/``on_end``) and never with the processor's lock held. The step events come from
      ``take``/``collect`` (the training loop's thread), ``provider_flush``/``provider_shutdown`` from the
      provider's ``force_flush``/``shutdown`` (the metrics processor is the provider's first span processor:
      they run before the export processors').
    - **Order:** hooks in registration order for each event; one ``collect`` fires ``step_reading`` then
      ``step_released`` (from its ``take``), then ``telemetry_counters``, ``step_metrics``, ``step_collected``,
      each over every hook before the next event.
    - **Never raises:** a hook should not raise; one that does is logged once (``internal_error``) and
      skipped: the other hooks and the collect go on (a raising ``provider_flush`` counts as ``False``).
    - **Fork:** hooks stay registered in a forked child, where each part resets its own state.
    """

    __slots__ = ()

    def step_reading(self, step: int | None, validate: bool) -> None:
        """Step ``(step, validate)`` is about to be read (each ``take``/``collect``): a part that holds ended
        spans the processor has not seen yet (the fast path's export pipeline) hands them over now."""

    def step_released(self, step: int | None, validate: bool) -> None:
        """The state of step ``(step, validate)`` was released (each ``take(release=True)``/``collect``), also
        when no span of it ended."""

    def telemetry_counters(self) -> Mapping[str, int]:
        """Counters since start that each ``collect`` reports as ``agent_loop/telemetry/<name>``."""
        return {}

    def step_metrics(self, step: int | None, validate: bool, metrics: StepMetrics) -> None:
        """Add keys of this part to ``collect``'s ``metrics`` (after the release and the counters)."""

    def step_collected(self, table: PhaseTable, metrics: StepMetrics, step: int | None, validate: bool) -> None:
        """``collect`` is done: ``table`` is what it computed ``metrics`` from, ``metrics`` the dict it returns
        (complete: counters and every hook's ``step_metrics`` in)."""

    def provider_flush(self, timeout_s: float) -> bool:
        """The provider's ``force_flush(timeout_s)``; ``False`` when not everything was flushed in time."""
        return True

    def provider_shutdown(self) -> None:
        """The provider's ``shutdown()``: stop what this part runs (threads, readers)."""
