"""A local Ray cluster for one test module, started without the outer ``OTEL_*`` environment (workers must get
their settings from what the driver hands them, not inherit them) and able to import this checkout."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from tests._support import REPO_ROOT

ROOT = str(REPO_ROOT)


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[None]:
    import ray

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OTEL_")}
    ray.init(
        address="local",  # a new cluster, never one another process (a `ray start`, a test's Cluster) left behind
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": ROOT}},
    )
    try:
        yield
    finally:
        ray.shutdown()
        os.environ.update(saved)
