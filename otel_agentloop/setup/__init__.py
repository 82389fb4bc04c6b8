"""Setting up tracing: ``configure()`` and the :class:`Handle` it returns. Not on the hot path.

``_configure``: ``configure()`` resolves the settings and builds; ``_wiring``: the provider, processors, exporters
and live view it wires together; ``_handle``: the handle, the current handle and what shutdown undoes;
``_run_id``: the run's identity (``rl.run.id``, ``rl.run.attempt``).
"""

from ._configure import configure
from ._handle import Handle, current_handle, write_step_summary
from ._run_id import adopt_run_id, new_run_id, process_run_id

__all__ = [
    "Handle",
    "adopt_run_id",
    "configure",
    "current_handle",
    "new_run_id",
    "process_run_id",
    "write_step_summary",
]
