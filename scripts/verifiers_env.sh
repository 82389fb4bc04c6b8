#!/usr/bin/env bash
# Create (or reuse) the venv for the verifiers stage: real verifiers 0.4.0 (prime-rl's environments) from PyPI,
# installed with uv (about a minute, where pip's resolver took eleven), and this repository's dependencies with
# its test and verifiers extras. One venv per set of pins (this file, the repo's pyproject and constraints), shared
# by every checkout and holding none's code (scripts/venv_lib.sh: this repository is installed from a temporary
# copy, then its modules removed); progress goes to stderr, the last line printed is this checkout's wrapper of the
# venv's python (it puts this checkout first on PYTHONPATH).
set -euo pipefail
. "$(dirname "$0")/venv_lib.sh" verifiers # exits printing the wrapper when the venv is ready
boot=$cache/uv-bootstrap
run() { echo "+ $*" >&2; "$@" || { echo "verifiers venv: FAILED: $*" >&2; exit 1; }; }
if [ ! -x "$boot/bin/uv" ]; then
  rm -rf "$boot"
  run python3 -m venv "$boot"
  run "$boot/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$cache/pip" install "uv==0.9.*"
fi
# uv alone in a folder of its own: verifiers' null harness runs its chat program with `uv` from PATH
mkdir -p "$cache/uv-bin" && ln -sf "$boot/bin/uv" "$cache/uv-bin/uv"
export UV_CACHE_DIR=$cache/uv
run "$boot/bin/uv" venv -q --python "$(command -v python3)" "$venv"
run "$boot/bin/uv" pip install -q --python "$venv/bin/python" -c "$repo/constraints.txt" \
  "verifiers==0.4.0" "$copy[test,verifiers]" "pytest-asyncio>=0.21"
# verifiers' own tests, from the sdist of the very version installed (tests/verifiers/test_verifiers_suite.py)
run "$boot/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$cache/pip" download --no-deps \
  --no-binary verifiers "verifiers==0.4.0" -d "$copy/sdist"
mkdir -p "$venv/src" && tar -C "$venv/src" -xzf "$copy/sdist/verifiers-0.4.0.tar.gz"
venv_done
