"""docs/settings.md names every variable the project reads: each the library declares (``config._settings``,
``config._environment``), each the stack's scripts read, and each port variable of the stack."""

from __future__ import annotations

import re
import sys

from otel_agentloop.config._environment import (
    CLI_VARIABLES,
    DRIVER_VARIABLE,
    LIBRARY_VARIABLES,
    SDK_VARIABLES,
    TOOL_VARIABLES,
)
from otel_agentloop.config._settings import SPECS
from tests._support import REPO_ROOT

ROOT = REPO_ROOT


def _expand(text: str) -> list[str]:
    """Shell-like brace expansion of a name: ``A_{B,C}`` -> A_B, A_C; ``A[_B]`` -> A, A_B (nested allowed)."""
    start = next((i for i, c in enumerate(text) if c in "{["), None)
    if start is None:
        return [text]
    close = {"{": "}", "[": "]"}[text[start]]
    depth, parts, part_start = 0, [], start + 1
    for i in range(start, len(text)):
        if text[i] in "{[":
            depth += 1
        elif text[i] in "}]":
            depth -= 1
            if depth == 0:
                assert text[i] == close, text
                parts.append(text[part_start:i])
                end = i
                break
        elif text[i] == "," and depth == 1:
            parts.append(text[part_start:i])
            part_start = i + 1
    alternatives = parts if close == "}" else ["", parts[0]]
    return [
        head + tail for alt in alternatives for head in _expand(text[:start] + alt) for tail in _expand(text[end + 1 :])
    ]


def documented() -> set[str]:
    text = (ROOT / "docs" / "settings.md").read_text()
    return {name for token in re.findall(r"`([A-Z][A-Z0-9_{},\[\]]*)`", text) for name in _expand(token)}


def test_every_declared_variable_is_documented() -> None:
    declared = {var for _, spec, _ in SPECS for var in (spec.env, *spec.read)}
    declared |= {v.name for v in (*SDK_VARIABLES, *LIBRARY_VARIABLES, *CLI_VARIABLES)}
    declared |= {*TOOL_VARIABLES, DRIVER_VARIABLE}
    missing = sorted(declared - documented())
    assert not missing, f"docs/settings.md does not name {missing}"


def test_every_variable_the_scripts_read_is_documented() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import stack_lib
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    read = set(stack_lib.PORT_VARS.values())
    for path in (ROOT / "scripts").glob("*.py"):
        read |= set(re.findall(r'environ(?:\.get)?[\[(]\s*"([A-Z][A-Z0-9_]+)"', path.read_text()))
    read |= {stack_lib.local_stack.VARIABLE}
    missing = sorted(read - documented())
    assert read > {"OTEL_AGENTLOOP_RUN_DIR", "JAEGER_QUERY_PORT", "OPENSEARCH_PORT_BASE"} and not missing, missing


def test_the_expansion() -> None:
    assert _expand("A_[{B,C}_]D") == ["A_D", "A_B_D", "A_C_D"]
    assert _expand("X_{P,Q}_{R,S}") == ["X_P_R", "X_P_S", "X_Q_R", "X_Q_S"]
