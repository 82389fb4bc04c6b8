"""The pages' style sheets and scripts: package data in ``assets/`` (``timeline.css``, ``run.js`` ...), each read
once (``importlib.resources``, so an installed wheel finds them as a checkout does)."""

from __future__ import annotations

import functools
from importlib import resources

_PACKAGE = __name__.rpartition(".")[0]
"""``otel_agentloop.analysis._rendering``: the package whose ``assets/`` folder holds the files."""


@functools.cache
def asset(name: str) -> str:
    """The text of ``assets/<name>`` (UTF-8, exactly as stored), read on first use and then kept."""
    return resources.files(_PACKAGE).joinpath("assets").joinpath(name).read_bytes().decode("utf-8")
