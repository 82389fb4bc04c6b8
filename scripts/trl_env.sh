#!/usr/bin/env bash
# Create (or reuse) the venv for the TRL stage: real TRL 1.16.x from PyPI with PyPI's torch 2.13.0 (the engine
# venv's, see scripts/engine-constraints.txt: it runs on CPU; TRL itself does not pin torch), resolved and installed
# with uv (pip took ~11 minutes to resolve trl+torch here, uv about one). One venv per set of pins (this file, the
# repo's pyproject and both constraints files), shared by every checkout and holding none's code
# (scripts/venv_lib.sh: this repository is installed from a temporary copy for its dependencies, entry points and
# startup .pth, then its modules removed); progress goes to stderr, the last line printed on stdout is this
# checkout's wrapper of the venv's python (it puts this checkout first on PYTHONPATH).
set -euo pipefail
pins=$(cd "$(dirname "$0")" && pwd)/engine-constraints.txt
. "$(dirname "$0")/venv_lib.sh" trl "$pins" # exits printing the wrapper when the venv is ready
run() { echo "+ $*" >&2; "$@" || { echo "trl venv: FAILED: $*" >&2; exit 1; }; }
# uv itself, in a small bootstrap venv of its own (shared by every build of this script)
boot=$cache/uv-bootstrap
if [ ! -x "$boot/bin/uv" ]; then
  rm -rf "$boot"
  run python3 -m venv "$boot"
  run "$boot/bin/python" -m pip --disable-pip-version-check -q install "uv==0.9.*"
fi
uv=$boot/bin/uv
run "$uv" venv -q --python "$(command -v python3)" "$venv"
export UV_CACHE_DIR=${UV_CACHE_DIR:-$cache/uv}
run "$uv" pip install -q --python "$venv/bin/python" -c "$repo/constraints.txt" -c "$pins" \
  "torch==2.13.0" "trl>=1.16,<1.17" "$copy[test,trl]"
venv_done
