#!/usr/bin/env bash
# Create (or reuse) the venv for the verl stage: real verl 0.9.1 from PyPI, a torch that runs on CPU, and this
# repository's dependencies. One venv per set of pins (this file, the repo's pyproject and constraints), shared by
# every checkout and holding none's code (scripts/venv_lib.sh); the last line printed is this checkout's wrapper of
# the venv's python (it puts this checkout first on PYTHONPATH).
set -euo pipefail
. "$(dirname "$0")/venv_lib.sh" verl # exits printing the wrapper when the venv is ready
python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$cache/pip" "$@"; }
run() { echo "+ $*" >&2; "$@" || { echo "verl venv: FAILED: $*" >&2; exit 1; }; }
run pip install --upgrade pip
# verl 0.9.1's agent loop imports cachetools/uvicorn/fastapi (its verl-core extra); don't use verl[cpu]:
# it pins an older torch.
run pip install -c "$repo/constraints.txt" "verl==0.9.1" cachetools uvicorn fastapi
# V1 trainer (verl's default): TransferQueue 0.1.11 + pyzmq + msgspec (verl-core extra). Its wheel also ships
# top-level recipe/ scripts/ tests/ tutorial/ packages that would shadow ours: install it aside, drop those, and
# put the folder on the path with a .pth file.
run pip install --no-deps --target "$venv/tq" "TransferQueue==0.1.11"
rm -rf "$venv/tq/recipe" "$venv/tq/scripts" "$venv/tq/tests" "$venv/tq/tutorial" "$venv/tq/bin"
"$venv/bin/python" -c "import site; open(site.getsitepackages()[0] + '/otel_agentloop_tq.pth', 'w').write('$venv/tq\\n')"
run pip install -c "$repo/constraints.txt" "pyzmq>=25" "msgspec>=0.18"
run pip install -c "$repo/constraints.txt" "$copy[test,verl]"
venv_done
