#!/usr/bin/env bash
# Create (or reuse) the venv for the verl stage: real verl 0.9.1 from PyPI, a torch that runs on CPU, and this
# repository installed editable. Cached under ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/verl-venv,
# keyed by this file's content and the repo's pyproject; the last line printed is the venv's python.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${OTEL_AGENTLOOP_CACHE:-$HOME/.cache/otel-agentloop}
venv=$cache/verl-venv
stamp=$(cat "$0" "$repo/pyproject.toml" "$repo/constraints.txt" | cksum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "verl venv: cached at $venv" >&2
  # the stamp is the content, not the checkout: a venv built from another (maybe deleted) clone is pointed here
  where=$(cd / && "$venv/bin/python" -c "import otel_agentloop, os; print(os.path.dirname(os.path.dirname(os.path.abspath(otel_agentloop.__file__))))" 2>/dev/null || true)
  if [ "$where" != "$repo" ]; then
    echo "verl venv: its editable install pointed at $repo (was ${where:-missing})" >&2
    "$venv/bin/python" -m pip --disable-pip-version-check -q --cache-dir "$cache/pip" install --no-deps -e "$repo" >&2 \
      || { echo "verl venv: FAILED to point it at $repo" >&2; exit 1; }
  fi
  echo "$venv/bin/python"
  exit 0
fi
t0=$SECONDS
rm -rf "$venv"
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
run pip install -c "$repo/constraints.txt" -e "$repo[test,verl]"
echo "$stamp" > "$venv/.stamp"
echo "verl venv: built in $((SECONDS - t0)) s at $venv ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv/bin/python"
