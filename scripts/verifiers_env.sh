#!/usr/bin/env bash
# Create (or reuse) the venv for the verifiers stage: real verifiers 0.4.0 (prime-rl's environments) from PyPI,
# installed with uv (about a minute, where pip's resolver took eleven), and this repository's dependencies with
# its test and verifiers extras. This repository itself is installed from a temporary copy (non-editable, so no
# build/ or *.egg-info is written into the checkout); the tests run with PYTHONPATH set to the calling checkout
# (`make test-verifiers`), so its code, not the installed copy's, is what runs, whichever clone built the venv.
# Cached under ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/verifiers-venv, keyed by this file's content and
# the repo's pyproject and constraints; progress goes to stderr, the last line printed is the venv's python.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${OTEL_AGENTLOOP_CACHE:-$HOME/.cache/otel-agentloop}
venv=$cache/verifiers-venv
stamp=$(cat "$0" "$repo/pyproject.toml" "$repo/constraints.txt" | cksum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "verifiers venv: cached at $venv" >&2
  echo "$venv/bin/python"
  exit 0
fi
t0=$SECONDS
rm -rf "$venv"
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
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
# the repo as a package only (no .git, venvs or caches): pip/uv may write build/ and *.egg-info beside it
tar -C "$repo" -cf - --exclude=.git --exclude=.venv --exclude='*.egg-info' --exclude=build --exclude=node_modules \
  --exclude=__pycache__ pyproject.toml setup.py README.md otel_agentloop otel_agentloop_startup.py \
  otel_agentloop_startup.pth otel_agentloop_switch.py | tar -C "$copy" -xf -
run "$boot/bin/uv" pip install -q --python "$venv/bin/python" -c "$repo/constraints.txt" \
  "verifiers==0.4.0" "$copy[test,verifiers]" "pytest-asyncio>=0.21"
# verifiers' own tests, from the sdist of the very version installed (tests/verifiers/test_verifiers_suite.py)
run "$boot/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$cache/pip" download --no-deps \
  --no-binary verifiers "verifiers==0.4.0" -d "$copy/sdist"
mkdir -p "$venv/src" && tar -C "$venv/src" -xzf "$copy/sdist/verifiers-0.4.0.tar.gz"
echo "$stamp" > "$venv/.stamp"
echo "verifiers venv: built in $((SECONDS - t0)) s at $venv ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv/bin/python"
