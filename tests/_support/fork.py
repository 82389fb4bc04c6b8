"""A real ``os.fork()`` while tracing: parent and child each trace samples into one OTLP-JSON file."""

from __future__ import annotations

import os
from typing import Any

import otel_agentloop as oal


def fork_and_trace(path: str, *, reconfigure: bool = False, **options: Any) -> int:
    """Configure, trace sample 0 here, sample 1 in a forked child, then sample 2 here; the child's pid. With
    ``reconfigure`` the child then shuts its handle down and traces sample 3 through a new plain one."""
    handle = oal.configure("fork-identity", file=path, set_global=False, schedule_delay_s=0.05, **options)
    try:
        with oal.sample(0, step=1):
            pass
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with oal.sample(1, step=1):
                    pass
                code = 0 if handle.force_flush(5) and handle.stats["exported"] >= 1 else 2
                if reconfigure:
                    handle.shutdown(5)  # restores the worker name configure() replaced: the child's own
                    again = oal.configure("fork-identity", file=path, set_global=False)
                    with oal.sample(3, step=1):
                        pass
                    again.shutdown(5)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with oal.sample(2, step=1):
            pass
        assert handle.force_flush(5)
    finally:
        handle.shutdown(5)
    return pid
