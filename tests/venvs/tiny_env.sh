#!/usr/bin/env bash
# A test-only cached venv built through the same head as scripts/*_env.sh (scripts/venv_lib.sh), with nothing but
# this package's metadata (installed from the head's copy, no dependencies): tests/project/test_venv_cache.py.
set -euo pipefail
. "$(dirname "$0")/../../scripts/venv_lib.sh" tiny
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --cache-dir "$cache/pip" --no-deps "$copy" >&2
venv_done
