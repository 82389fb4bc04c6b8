"""numpy, imported where first used: ``import otel_agentloop`` stays free of it (numpy costs 0.1-0.3 s to import).

A module that computes with numpy declares it once, at module level::

    if TYPE_CHECKING:
        import numpy as np
    else:
        np = LazyNumpy(globals(), "np")

The first attribute read on ``np`` imports numpy and puts the module itself in the caller's globals under that
name: every later ``np.x`` there is a plain global read, as with an eager import. Nothing here runs per span.

Fork safety: the import also loads ``numpy.ma`` (``np.percentile`` would import it lazily inside ``collect()``),
and it holds a lock that ``os.fork`` waits for: a child forked while another thread runs that import would inherit
the module's import lock, held by a thread the child does not have, and block forever on its first numpy use.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import MutableMapping
from types import ModuleType

from ..config._fork import hold_across_fork

_lock = threading.RLock()  # reentrant: a fork from inside the import itself must not wait for it


def load_numpy() -> ModuleType:
    """``numpy`` (with ``numpy.ma``), imported now if it was not yet."""
    module = sys.modules.get("numpy")
    if module is None or "numpy.ma" not in sys.modules:
        with _lock:
            import numpy

            importlib.import_module("numpy.ma")  # eager: see the module docstring
            module = numpy
    return module


class LazyNumpy:
    """Stands for ``numpy`` under ``name`` in ``namespace`` (a module's ``globals()``) until the first attribute
    read, which replaces it there by numpy itself."""

    __slots__ = ("_name", "_namespace")

    def __init__(self, namespace: MutableMapping[str, object], name: str) -> None:
        self._namespace = namespace
        self._name = name

    def __getattr__(self, attr: str) -> object:
        module = load_numpy()
        self._namespace[self._name] = module
        return getattr(module, attr)


hold_across_fork(_lock)
