"""``python -m otel_agentloop.integrations.verifiers._toolserver <carrier> <module>``: a verifiers tool server that
continues the sample's trace (see :mod:`._tools`). Configures tracing from the environment its launcher handed
over, adopts the sample in ``<carrier>`` (JSON: ``traceparent``, ``tracestate``, the sample's identity),
instruments verifiers, then runs ``<module>`` as ``__main__``, as ``python -m <module>`` would. Tracing
failures are logged and never stop the server."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m otel_agentloop.integrations.verifiers._toolserver <carrier> <module>")
    carrier, module = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    try:
        from ...core._guard import internal_error

        try:
            from ... import configure
            from . import instrument
            from ._tools import adopt

            configure(
                resource_attributes={"process.pid": os.getpid()},
                worker=f"verifiers-tools:{os.getpid()}",
                set_global=False,  # ours only: the MCP library's own spans would each start a trace of their own
            )
            adopt(carrier)
            instrument()
        except Exception:
            internal_error("verifiers.toolserver")
    except Exception:  # pragma: no cover - the package itself failed to import: serve untraced
        pass
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
