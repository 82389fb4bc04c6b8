#!/usr/bin/env bash
# Create (or reuse) the venv for the TRL stage: real TRL 1.16.x from PyPI with PyPI's torch 2.13.0 (the engine
# venv's, see scripts/engine-constraints.txt: it runs on CPU; TRL itself does not pin torch), resolved and installed
# with uv (pip took ~11 minutes to resolve trl+torch here, uv about one). Cached under
# ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/trl-venv, keyed by this file's content, the repo's pyproject and
# both constraints files; progress goes to stderr, the last line printed on stdout is the venv's python.
#
# This repository is installed NON-editable from a temporary copy (its dependencies, the entry points that
# opentelemetry-instrument reads, the startup .pth): the venv holds no path to any checkout. Callers run the
# checkout's own code with PYTHONPATH=<checkout> (make test-trl does), which shadows the installed copy.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${OTEL_AGENTLOOP_CACHE:-$HOME/.cache/otel-agentloop}
venv=$cache/trl-venv
pins=$repo/scripts/engine-constraints.txt
stamp=$(cat "$0" "$repo/pyproject.toml" "$repo/constraints.txt" "$pins" | cksum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "trl venv: cached at $venv" >&2
  echo "$venv/bin/python"
  exit 0
fi
t0=$SECONDS
run() { echo "+ $*" >&2; "$@" || { echo "trl venv: FAILED: $*" >&2; exit 1; }; }
# uv itself, in a small bootstrap venv of its own (shared by every build of this script)
boot=$cache/uv-bootstrap
if [ ! -x "$boot/bin/uv" ]; then
  rm -rf "$boot"
  run python3 -m venv "$boot"
  run "$boot/bin/python" -m pip --disable-pip-version-check -q install "uv==0.9.*"
fi
uv=$boot/bin/uv
rm -rf "$venv"
run "$uv" venv -q --python "$(command -v python3)" "$venv"
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
cp -r "$repo/pyproject.toml" "$repo/setup.py" "$repo/README.md" "$repo/otel_agentloop" "$repo/otel_agentloop_startup.py" \
  "$repo/otel_agentloop_startup.pth" "$repo/otel_agentloop_switch.py" "$copy/"
find "$copy" -name __pycache__ -prune -exec rm -rf {} +
export UV_CACHE_DIR=${UV_CACHE_DIR:-$cache/uv}
run "$uv" pip install -q --python "$venv/bin/python" -c "$repo/constraints.txt" -c "$pins" \
  "torch==2.13.0" "trl>=1.16,<1.17" "$copy[test,trl]"
echo "$stamp" > "$venv/.stamp"
echo "trl venv: built in $((SECONDS - t0)) s at $venv ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv/bin/python"
