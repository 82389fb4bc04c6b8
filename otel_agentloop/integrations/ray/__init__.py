"""Ray: tracing set up in every worker, the step context carried across actor calls, metrics merged.

Driver::

    handle = otel_agentloop.configure("rollout")
    ray.init(runtime_env=otel_agentloop.integrations.ray.runtime_env(handle))
    with otel_agentloop.step(step):
        refs = [w.generate.remote(chunk, otel_carrier=carrier()) for w, chunk in zip(workers, chunks)]
        ...
    tables = ray.get([w.phase_table.remote(step) for w in workers])   # each calls worker_table(step)
    verdicts = ray.get([w.verdict.remote(step) for w in workers])      # each calls worker_verdict(step)
    metrics = merge_metrics(tables, verdicts)   # verl's dict, same code as collect(); writes rl.step.summary

Worker: decorate the actor method with :func:`traced_remote` (it adds the keyword ``otel_carrier`` and
declares it in ``__signature__``, which Ray checks after unwrapping decorators); inside, the driver's step
is current, so ``otel_agentloop.sample(...)`` behaves as in the driver. Every worker process configures
itself from the driver's settings (``worker_process_setup_hook``, or lazily on first use).

The carrier is a plain dict (W3C ``traceparent``/``tracestate`` plus step, validate and trace mode), so it
can also travel inside a payload instead of as a keyword.

One switch for every node: ``opentelemetry-instrument python driver.py`` loads :class:`RayInstrumentor`
(entry point ``ray``), which wraps ``ray.init`` in the driver so that its ``runtime_env`` carries the
driver's settings and the setup hook to every node (:func:`instrument`). A driver whose command line names
the setup hook (verl's ``...worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker``) gets
the same wrap from the installed ``otel_agentloop_startup.pth``. Settings travel only through
``runtime_env``: a worker never relies on its node's shell, and one that got no settings from its driver
says so once, naming its node, instead of writing a local file nobody reads.

Modules, one job each: ``_handover`` (what the driver hands every worker in ``runtime_env``, and how a worker
takes it), ``_worker`` (a worker's setup), ``_remote`` (the carrier, :func:`remote_step`, :func:`traced_remote`),
``_merge`` (workers' tables, verdicts and running samples, merged in the driver), ``_instrumentor`` (``ray.init``
wrapped: :class:`RayInstrumentor`), ``_common`` (Ray imported on demand, the setup hook's path, this process's
handle). Every public name is here.
"""

from __future__ import annotations

from ...config._environment import DRIVER_VARIABLE
from ._common import SETUP_HOOK
from ._handover import SPECS_BY_NAME, runtime_env
from ._instrumentor import RayInstrumentor, instrument, is_instrumented, traced_runtime_env, uninstrument
from ._instrumentor import _init as _init  # tests read oal_ray._init
from ._merge import MAX_LISTED, add_verdicts, gather_inflight, inflight, merge_metrics, worker_table, worker_verdict
from ._remote import CARRIER_KEYWORD, carrier, remote_step, traced_remote
from ._remote import _flush as _flush  # tests call oal_ray._flush in an actor
from ._worker import route_logs_to_stderr, setup_worker

__all__ = [
    "CARRIER_KEYWORD",
    "DRIVER_VARIABLE",
    "MAX_LISTED",
    "SETUP_HOOK",
    "SPECS_BY_NAME",
    "RayInstrumentor",
    "add_verdicts",
    "carrier",
    "gather_inflight",
    "inflight",
    "instrument",
    "is_instrumented",
    "merge_metrics",
    "remote_step",
    "route_logs_to_stderr",
    "runtime_env",
    "setup_worker",
    "traced_remote",
    "traced_runtime_env",
    "uninstrument",
    "worker_table",
    "worker_verdict",
]
