"""Drop-in instrumentation of verl 0.9.x's agent loop: ``instrument()`` / ``uninstrument()``.

Patched (read from verl 0.9.1's source; each patch is a ``wrapt`` wrapper or, where verl's own decorator must
stay outermost, a re-decoration, and ``uninstrument()`` puts back the exact original objects):

- ``AgentLoopManager.generate_sequences``: the step span (``global_steps``, ``validate``); the W3C carrier
  rides to the worker actors inside ``meta_info`` (no signature change for Ray); our extra keys and the
  slowest sample's trace id land next to verl's ``timing``, whose values are not changed.
- ``AgentLoopManager._performance_metrics``: verl's dict, plus ours (percentiles, slowest sample index, ...)
  computed from the workers' phase tables with the same code as ``collect()``.
- ``AgentLoopWorker.generate_sequences``: re-enters the driver's step from the carrier; ships this worker's
  per-sample phase table back inside the per-sample metrics list (verl validates per-sample metrics into a
  fixed pydantic model before that point, so the extra key survives and verl's formula ignores it).
- ``AgentLoopWorker._run_agent_loop``: the sample's root span, with verl's trajectory identity (step,
  sample_index, rollout_n, validate); prompt/response lengths as verl computes them; verl's num_preempted.
- ``LLMServerClient.generate`` and ``FullyAsyncLLMServerClient.generate``: one generation span per turn with
  GenAI attributes (token counts, finish reason) and ``rl.num_preempted``.
- ``simple_timer`` where ``tool_agent_loop`` uses it: inside verl's ``tool_calls`` timer (around the turn's
  ``asyncio.gather``), a ``rl.tool_calls`` span, so the phase time is exactly what verl measures (the gather's
  wall time includes scheduling the calls, which the calls' own spans do not see);
- ``ToolAgentLoop._call_tool``: one ``execute_tool {name}`` span per call, below it (parallel calls overlap).
- ``AgentLoopWorker._compute_score``: the reward span, with the score.

Configure tracing first (``otel_agentloop.configure()`` in the driver; on Ray, ``runtime_env`` from
``otel_agentloop.integrations.ray`` plus ``worker_process_setup_hook`` calling :func:`instrument` in workers).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import _context
from .. import semconv as sc
from .._configure import current_handle
from .._guard import internal_error, logger
from .._phase import PhaseSpec, finish, start
from .._table import PhaseTable, compute_metrics

SUPPORTED = ("0.9.",)
TABLE_KEY = "otel_agentloop_table"
META_KEY = "otel_agentloop"
CARRIER_KEY = "otel_agentloop_carrier"
_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
_TOOL_LOOP = "verl.experimental.agent_loop.tool_agent_loop"
_LLM_SERVER = "verl.workers.rollout.llm_server"

_lock = threading.Lock()
_originals: list[tuple[Any, str, Any]] = []  # (owner, attribute, original object)


def _wrapt() -> Any:
    try:
        import wrapt
    except ImportError as exc:
        raise ImportError("otel_agentloop.integrations.verl needs wrapt: pip install 'otel-agentloop[verl]'") from exc
    return wrapt


def is_instrumented() -> bool:
    return bool(_originals)


def instrument() -> bool:
    """Patch the installed verl (idempotent). Returns whether verl is instrumented afterwards.

    An absent or unsupported verl is reported with a warning and left alone.
    """
    with _lock:
        if _originals:
            return True
        try:
            version = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            logger.warning("otel_agentloop: verl is not installed; nothing to instrument "
                           "(pip install 'otel-agentloop[verl]')")
            return False
        if not version.startswith(SUPPORTED):
            logger.warning("otel_agentloop: verl %s is not supported (supported: %s); not instrumenting",
                           version, ", ".join(v + "x" for v in SUPPORTED))
            return False
        wrapt = _wrapt()
        agent_loop = importlib.import_module(_AGENT_LOOP)
        tool_loop = importlib.import_module(_TOOL_LOOP)
        llm_server = importlib.import_module(_LLM_SERVER)
        try:
            manager, worker = agent_loop.AgentLoopManager, agent_loop.AgentLoopWorker
            _replace(manager, "generate_sequences", _manager_generate_sequences(manager, agent_loop))
            _wrap(wrapt, manager, "_performance_metrics", _performance_metrics)
            _wrap(wrapt, worker, "generate_sequences", _worker_generate_sequences)
            _wrap(wrapt, worker, "_run_agent_loop", _run_agent_loop)
            _wrap(wrapt, worker, "_compute_score", _compute_score)
            _wrap(wrapt, tool_loop.ToolAgentLoop, "_call_tool", _call_tool)
            _replace(tool_loop, "simple_timer", _traced_timer(vars(tool_loop)["simple_timer"]))
            for name in ("LLMServerClient", "FullyAsyncLLMServerClient"):
                cls = getattr(llm_server, name, None)
                if cls is not None and "generate" in vars(cls):
                    _wrap(wrapt, cls, "generate", _generate)
        except Exception:
            _restore()
            raise
        return True


def uninstrument() -> None:
    """Put back every patched attribute (the very same objects); idempotent."""
    with _lock:
        _restore()


def uninstrumented_performance_metrics(metrics: Any, output: Any) -> Any:
    """verl's own ``AgentLoopManager._performance_metrics`` (unpatched): the reference for parity checks."""
    agent_loop = importlib.import_module(_AGENT_LOOP)
    method = vars(agent_loop.AgentLoopManager)["_performance_metrics"]
    return getattr(method, "__wrapped__", method)(None, metrics, output)


def _restore() -> None:
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)


def _wrap(wrapt: Any, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    original = vars(owner)[name]
    _originals.append((owner, name, original))
    setattr(owner, name, wrapt.FunctionWrapper(original, wrapper))


def _replace(owner: Any, name: str, new: Any) -> None:
    _originals.append((owner, name, vars(owner)[name]))
    setattr(owner, name, new)


# -- the manager (driver) ---------------------------------------------------------------------------
def _manager_generate_sequences(manager: Any, agent_loop: Any) -> Any:
    """verl's ``auto_await`` inspects its caller, so it must stay outermost: wrap the function beneath it."""
    original = vars(manager)["generate_sequences"]
    inner = getattr(original, "__wrapped__", original)
    auto_await = agent_loop.auto_await

    async def generate_sequences(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        meta = prompts.meta_info
        step = meta.get("global_steps", -1)
        validate = bool(meta.get("validate", False))
        from .ray import carrier

        with _context.step(int(step), validate=validate):
            meta[CARRIER_KEY] = carrier()
            try:
                output = await inner(self, prompts, *args, **kwargs)
            finally:
                meta.pop(CARRIER_KEY, None)
        try:
            output.meta_info.pop(CARRIER_KEY, None)
            extra = getattr(self, "_otel_agentloop_last", None)
            if extra is not None:
                output.meta_info[META_KEY] = extra
        except Exception:
            internal_error("verl.generate_sequences.meta")
        return output

    generate_sequences.__wrapped__ = original  # type: ignore[attr-defined]
    return auto_await(generate_sequences)


_TOOL_CALLS = PhaseSpec(sc.TOOL_CALLS, sc.TOOL_CALLS_SPAN, {sc.RL_PHASE: sc.TOOL_CALLS})


def _traced_timer(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``simple_timer``, plus a ``rl.tool_calls`` span inside its ``tool_calls`` timer."""

    @contextlib.contextmanager
    def simple_timer(name: str, timing_raw: Any) -> Iterator[None]:
        with original(name, timing_raw):
            started = start(_TOOL_CALLS) if name == sc.TOOL_CALLS else None
            if started is None:
                yield
                return
            try:
                yield
            except BaseException as exc:
                finish(started, exc)
                raise
            finish(started)

    simple_timer.__wrapped__ = original  # type: ignore[attr-defined]
    return simple_timer


def _performance_metrics(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    # (metrics, output); called through the class, wrapt may hand the explicit self over in args
    metrics = kwargs.get("metrics", next((a for a in args if isinstance(a, list)), None))
    tables = []
    try:
        for chunk in metrics or ():
            for row in chunk:
                table = row.pop(TABLE_KEY, None) if isinstance(row, dict) else None
                if table is not None:
                    tables.append(table)
    except Exception:
        internal_error("verl._performance_metrics.tables")
    timing = wrapped(*args, **kwargs)
    if tables:
        try:
            ours = compute_metrics(PhaseTable.concat(tables))
            for key, value in ours.items():
                timing.setdefault(key, value)  # verl's own values are never replaced
            extra = {"slowest_trace_id": ours.slowest_trace_id, "slowest_sample": ours.slowest_sample}
            if instance is not None:
                instance._otel_agentloop_last = extra
        except Exception:
            internal_error("verl._performance_metrics.ours")
    return timing


# -- the worker (actor) -----------------------------------------------------------------------------
async def _worker_generate_sequences(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    batch = args[0] if args else kwargs.get("batch")
    meta = getattr(batch, "meta_info", {}) or {}
    carrier = meta.pop(CARRIER_KEY, None)
    step = meta.get("global_steps", -1)
    validate = bool(meta.get("validate", False))
    from .ray import remote_step

    with remote_step(carrier):
        output = await wrapped(*args, **kwargs)
    try:
        handle = current_handle()
        rows = output.meta_info.get("metrics")
        if handle is not None and rows:
            handle.force_flush(5.0)
            rows[0][TABLE_KEY] = handle.metrics.take(int(step), validate)
    except Exception:
        internal_error("verl.worker.generate_sequences.table")
    return output


async def _run_agent_loop(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = args[1] if len(args) > 1 else kwargs.get("trajectory")
    try:
        index, rollout = int(trajectory["sample_index"]), int(trajectory["rollout_n"])
        step, validate = int(trajectory["step"]), bool(trajectory["validate"])
    except Exception:
        internal_error("verl._run_agent_loop.trajectory")
        return await wrapped(*args, **kwargs)
    agent = kwargs.get("agent_name")
    attrs = {"rl.agent.name": str(agent)} if agent else None
    async with _context.sample(index, rollout, step=step, validate=validate, attributes=attrs) as handle:
        output = await wrapped(*args, **kwargs)
        try:
            _record_sample(handle, output)
        except Exception:
            internal_error("verl._run_agent_loop.record")
        return output


def _record_sample(handle: _context.SampleHandle, output: Any) -> None:
    """Lengths as verl's manager computes them (attention mask over the padded prompt / response), verl's
    num_preempted, and the reward."""
    width = int(output.prompt_ids.shape[-1])
    mask = output.attention_mask[0]
    handle.record(prompt_length=int(mask[:width].sum()), response_length=int(mask[width:].sum()),
                  num_preempted=int(output.metrics.num_preempted), reward=output.reward_score)


def _spec(cache: dict[str, PhaseSpec], key: str, build: Callable[[], PhaseSpec]) -> PhaseSpec:
    spec = cache.get(key)
    if spec is None:
        spec = cache[key] = build()
    return spec


_generate_specs: dict[str, PhaseSpec] = {}
_tool_specs: dict[str, PhaseSpec] = {}
_REWARD = PhaseSpec.build(sc.COMPUTE_SCORE)


async def _awaited(started: tuple[Any, object] | None, wrapped: Any, args: Any, kwargs: Any) -> Any:
    """Await the wrapped coroutine; if it raises, end ``started`` with the error and re-raise it unchanged."""
    try:
        return await wrapped(*args, **kwargs)
    except BaseException as exc:
        if started is not None:
            finish(started, exc)
        raise


async def _generate(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    config = getattr(instance, "config", None)
    try:
        model = str(config.actor_rollout_ref.model.get("path", "")) if config is not None else ""
    except Exception:
        model = ""
    spec = _spec(_generate_specs, model, lambda: PhaseSpec.build(sc.GENERATE, model=model.rsplit("/", 1)[-1] or None))
    provider = None
    try:
        provider = str(config.actor_rollout_ref.rollout.name) if config is not None else None
    except Exception:
        provider = None
    started = start(spec, extra={sc.GEN_AI_PROVIDER_NAME: provider} if provider else None)
    output = await _awaited(started, wrapped, args, kwargs)
    if started is None:
        return output
    try:
        span = started[0]
        prompt_ids = kwargs.get("prompt_ids")
        if prompt_ids is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, len(prompt_ids))
        span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, len(output.token_ids))
        if output.stop_reason is not None:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (str(output.stop_reason),))
        if output.num_preempted is not None:
            span.set_attribute(sc.RL_NUM_PREEMPTED, int(output.num_preempted))
    except Exception:
        internal_error("verl.generate.record")
    finish(started)
    return output


async def _call_tool(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    tool_call = args[0] if args else kwargs.get("tool_call")
    name = str(getattr(tool_call, "name", "") or "unknown")
    spec = _spec(_tool_specs, name, lambda: PhaseSpec.build(sc.TOOL_CALLS, tool=name))
    call_id = getattr(tool_call, "id", None)
    started = start(spec, extra={sc.GEN_AI_TOOL_CALL_ID: str(call_id)} if call_id else None)
    result = await _awaited(started, wrapped, args, kwargs)
    if started is not None:
        finish(started)
    return result


async def _compute_score(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    started = start(_REWARD)
    result = await _awaited(started, wrapped, args, kwargs)
    if started is None:
        return result
    try:
        outputs = args[0] if args else kwargs.get("outputs")
        score = outputs[-1].reward_score if outputs else None
        if score is not None:
            started[0].set_attribute(sc.RL_REWARD_SCORE, float(score))
    except Exception:
        internal_error("verl._compute_score.record")
    finish(started)
    return result
