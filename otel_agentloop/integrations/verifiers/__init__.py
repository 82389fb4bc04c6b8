"""Drop-in tracing of verifiers environments (prime-rl's rollouts; verifiers 0.4's ``v1`` API):
``instrument()`` / ``uninstrument()``, or :class:`VerifiersInstrumentor` (``opentelemetry_instrumentor`` entry
point ``verifiers``, so ``opentelemetry-instrument vf-eval ...`` needs no code change).

While instrumented, across verifiers' own processes and hops:

- each agent run on a task (``Agent.run``) is an ``rl.sample``: index ``task.data.idx``, rollout number counted
  per task within the step, verifiers' final reward and turn count, its trace id (``verifiers.trace.id``);
- each model call the interception server sends upstream is a generation turn (``chat <model>``) in that
  sample's trace, found by the rollout's session id; its ``traceparent`` goes out with the request, so a vLLM
  OpenAI server's ``llm_request`` nests under it; usage tokens and finish reasons from the response;
- each tool call is an ``execute_tool <name>`` span in the tool-server process (local subprocess runtime; an
  eval-level shared server too, each call in its own sample's trace), continuing the sample's trace;
- the eval process's wait for a turn's tool calls (from a turn handing them to the harness to the rollout's next
  model request) is an ``rl.tool_calls`` span, verl's tool block: ``agent_loop/tool_calls`` in ``collect()``;
- ``Task.score`` is the ``rl.reward`` span with the reward; an eval run (``run_eval``) is an ``rl.step``;
- a rollout an ``EnvServer`` serves for an ``EnvClient`` (prime-rl) continues the caller's step and trace.

``collect()`` then gives verl's ``agent_loop/*`` metrics. Results, exceptions, concurrency and cancellation
are verifiers' own: wrappers call the originals unchanged. ``instrument()`` never imports verifiers: modules
not imported yet are patched when they are. Tracing itself is set up by ``otel_agentloop.configure()`` (or
``opentelemetry-instrument``); without it every wrapper calls straight through.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._instrumentor import Instrumentor
from . import _envserver, _patching, _rollout, _toolphase, _tools, _turns
from ._patching import Target

__all__ = ["VerifiersInstrumentor", "instrument", "is_instrumented", "uninstrument"]

V1 = "verifiers.v1"
TARGETS: list[Target] = [
    (f"{V1}.agent", "Agent", "run", _rollout.agent_run),
    (f"{V1}.rollout", "Rollout", "__init__", _rollout.rollout_init),
    (f"{V1}.task", "Task", "score", _rollout.task_score),
    (f"{V1}.cli.eval.runner", "", "run_eval", _rollout.run_eval),
    (f"{V1}.clients.eval", "EvalClient", "get_response", _turns.get_response),
    (f"{V1}.clients.eval", "EvalClient", "relay", _turns.relay),
    (f"{V1}.clients.train", "TrainClient", "get_response", _turns.get_response),
    (f"{V1}.interception.server", "InterceptionServer", "record_call", _turns.record_call),
    (f"{V1}.session", "RolloutSession", "refused", _toolphase.refused),
    (f"{V1}.rollout", "Rollout", "step", _toolphase.rollout_step),
    (f"{V1}.serve.client", "EnvClient", "_request", _envserver.client_request),
    (f"{V1}.serve.server", "EnvServer", "_handle", _envserver.server_handle),
    (f"{V1}.mcp.launch", "", "serve_in_runtime", _tools.serve_in_runtime),
    (f"{V1}.mcp.launch", "", "_shared_url_for_rollout", _tools.shared_url),
    (f"{V1}.runtimes.subprocess", "SubprocessRuntime", "run_background", _tools.run_background),
    (f"{V1}.mcp.server", "ServerBase", "_with_state", _tools.with_state),
]


def is_instrumented() -> bool:
    return _patching.state.active


def instrument() -> bool:
    """Patch verifiers (idempotent; now, or as each module is imported). Returns ``True``."""
    with _patching.lock:
        if not _patching.state.active:
            _patching.state.active = True
            _patching.install(TARGETS)
        return True


def uninstrument() -> None:
    """Put back verifiers' very own objects (idempotent)."""
    with _patching.lock:
        _patching.state.active = False
        _patching.restore()
        _rollout.auto_configure(False)


class VerifiersInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for verifiers (entry point ``verifiers``): :func:`instrument` /
    :func:`uninstrument`."""

    package = "verifiers"

    def _start(self, kwargs: Mapping[str, object]) -> None:
        _rollout.auto_configure(True)  # no code change: tracing from the environment, at the first eval or rollout
        instrument()

    off = staticmethod(uninstrument)
