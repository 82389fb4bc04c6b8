"""``python -m otel_agentloop.integrations.verifiers._toolserver <module>``: a verifiers tool server that continues
the sample's trace (see :mod:`._tools`). Configures tracing from the environment its launcher handed over,
instruments verifiers, then runs ``<module>`` as ``__main__``, as ``python -m <module>`` would. Tracing
failures are logged and never stop the server."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m otel_agentloop.integrations.verifiers._toolserver <module> [args...]")
    module = sys.argv[1]
    del sys.argv[1]
    try:
        from ...core._guard import internal_error

        try:
            from ... import configure
            from . import instrument
            from ._tools import adopt_launch_environment

            configure(
                resource_attributes={"process.pid": os.getpid()},
                worker=f"verifiers-tools:{os.getpid()}",
                set_global=False,  # ours only: the MCP library's own spans would each start a trace of their own
            )
            adopt_launch_environment(os.environ)
            instrument()
        except Exception:
            internal_error("verifiers.toolserver")
    except Exception:  # pragma: no cover - the package itself failed to import: serve untraced
        pass
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
