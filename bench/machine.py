"""The machine line every results section starts with."""

from __future__ import annotations

import contextlib
import os
import platform

from opentelemetry.version import __version__ as otel_version


def machine() -> str:
    cpu = "unknown cpu"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"OpenTelemetry SDK {otel_version}, {platform.system()} {platform.release()}"
    )
