# The shared head of the cached venvs (scripts/{engine,verl,verifiers,trl}_env.sh source it: `. venv_lib.sh NAME
# [PIN FILE...]`). One venv per set of pins, shared by every checkout, holding no checkout's code:
#
# - Key: a hash of the calling script (its package list), pyproject.toml but its [tool.*] tables and comment
#   lines, constraints.txt and the extra pin files.
#   The venv is $OTEL_AGENTLOOP_CACHE/venvs/NAME-KEY (cache root default ~/.cache/otel-agentloop): checkouts
#   with other pins get another venv and never delete this one.
# - Contents: third-party packages, and this package's metadata only (its dist-info: the entry points that
#   opentelemetry-instrument reads; the startup .pth, which imports by name): it is installed from a temporary
#   copy, then its modules are removed, so `import otel_agentloop` with the bare venv python fails.
# - Use: the last line printed is a wrapper for the calling checkout, $OTEL_AGENTLOOP_CACHE/venvs/run/NAME-KEY-
#   <checkout hash>: it runs the venv's python with that checkout first on PYTHONPATH (the environment of that
#   one process tree; nothing shared is rewritten per call), so each checkout runs its own code.
# - Concurrency: a build holds the venv's lock (flock) exclusively; a second caller with the same pins waits, then
#   reuses it. A wrapper holds it shared while its python runs.
# - Bound: on each call, venvs of this NAME beyond the $OTEL_AGENTLOOP_VENVS_KEEP (default 2) most recently used
#   are removed, each only if its lock is free (no wrapper running it, no build). By hand: `rm -rf` a
#   venvs/NAME-KEY folder when nothing runs it.
# - The previous layout (one $cache/NAME-venv per user, rebuilt on any change) is adopted, once, by a link, when
#   its stamp is the one it wrote for exactly these pins (VENV_LEGACY below): no rebuild, nothing moved.
#
# After sourcing, when the venv is ready, the script has printed the wrapper and exited 0. Otherwise the caller
# builds into $venv (in place: venvs are not relocatable) with $repo, $cache, $copy (this repository as a
# package, for a non-editable install), then calls venv_done.

venv_name=$1
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${OTEL_AGENTLOOP_CACHE:-$HOME/.cache/otel-agentloop}
VENV_LAYOUT=1 # part of the key: bump when what this head puts in a venv changes
# NAME:LEGACY_STAMP:KEY: a $cache/NAME-venv stamped LEGACY_STAMP was built from the same pins as KEY
VENV_LEGACY="engine:4141323854:1593f30bda46 verl:2541705762:df87068457d0 verifiers:2127759332:3385752243e8
trl:3031875324:3f445d1423cc"
venv_key=$({
  echo "layout $VENV_LAYOUT"
  cat "$0"
  # pyproject.toml less its [tool.*] tables (linters, pytest, import contracts) and its comment lines: they put
  # nothing in a venv
  awk '/^[[:space:]]*#/ { next } /^\[\[?tool\./ { skip = 1; next } /^\[/ { skip = 0 } !skip' "$repo/pyproject.toml"
  cat "$repo/constraints.txt" "$@"
} | sha256sum | cut -c1-12)
venv_root=$cache/venvs
venv=$venv_root/$venv_name-$venv_key
venv_lockfile=$venv_root/$venv_name-$venv_key.lock
mkdir -p "$venv_root/run"
touch "$venv_lockfile" # its mtime: when this venv was last asked for (venv_prune keeps the recent ones)

venv_ready() { [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.key" 2>/dev/null)" = "$venv_key" ]; }

# print the calling checkout's wrapper (written atomically when missing or different) and exit 0
venv_print_wrapper() {
  local hash wrapper tmp body
  hash=$(printf '%s' "$repo" | cksum | cut -d' ' -f1)
  wrapper=$venv_root/run/$venv_name-$venv_key-$hash
  body=$(
    cat <<EOF
#!/usr/bin/env bash
# the $venv_name venv's python for the checkout $repo (scripts/venv_lib.sh): that checkout's code first on
# PYTHONPATH; holds the venv's lock shared while it runs, so pruning never removes it under a running process
exec 197<$(printf '%q' "$venv_lockfile") && flock -s 197 || exit 1
[ -x $(printf '%q' "$venv/bin/python") ] || { echo "$venv_name venv removed: run scripts/${venv_name}_env.sh again" >&2; exit 1; }
export PYTHONPATH=$(printf '%q' "$repo")\${PYTHONPATH:+:\$PYTHONPATH}
exec $(printf '%q' "$venv/bin/python") "\$@"
EOF
  )
  if [ "$(cat "$wrapper" 2>/dev/null)" != "$body" ]; then
    tmp=$(mktemp "$wrapper.XXXXXX")
    printf '%s\n' "$body" >"$tmp" && chmod 755 "$tmp" && mv -f "$tmp" "$wrapper"
  fi
  echo "$wrapper"
  exit 0
}

# link the previous layout's venv in as this key's, when it was stamped for these very pins
venv_adopt_legacy() {
  local entry legacy=$cache/$venv_name-venv
  for entry in $VENV_LEGACY; do
    if [ "$entry" = "$venv_name:$(cat "$legacy/.stamp" 2>/dev/null):$venv_key" ] && [ -x "$legacy/bin/python" ] \
      && [ ! -L "$legacy" ]; then
      echo "$venv_key" >"$legacy/.key"
      ln -sfn "$legacy" "$venv.link.$$" && mv -T "$venv.link.$$" "$venv"
      echo "$venv_name venv: adopted $legacy (built for these pins) as $venv" >&2
      return 0
    fi
  done
  return 1
}

# remove venvs of this name beyond the most recently used, each only while nothing holds its lock
venv_prune() {
  local keep=${OTEL_AGENTLOOP_VENVS_KEEP:-2} lock old target fd other shared
  [ "$keep" -ge 1 ] 2>/dev/null || keep=2
  # shellcheck disable=SC2012 # names are ours: NAME-<hex>.lock
  ls -t "$venv_root/$venv_name"-*.lock 2>/dev/null | tail -n +$((keep + 1)) | while read -r lock; do
    old=${lock%.lock}
    [ "$old" = "$venv" ] && continue
    target=$old
    [ -L "$old" ] && target=$(readlink -f "$old")
    # a previous layout's folder adopted under several keys (by checkouts of other pins formulas): while another
    # key (this one included) still links to it, only this key's link goes
    shared=
    for other in "$venv_root/$venv_name"-*; do
      case $other in "$old" | *.lock | *.link.*) continue ;; esac
      [ "$(readlink -f "$other")" = "$target" ] && shared=1
    done
    # a process started without the wrapper (an old script's caller): its command line or a mapped file names it
    if grep -lsaF -e "$old/" -e "$target/" /proc/[0-9]*/cmdline /proc/[0-9]*/maps >/dev/null 2>&1; then
      continue
    fi
    exec {fd}>>"$lock"
    if flock -n -x "$fd"; then
      if [ -n "$shared" ]; then rm -f "$old"; else rm -rf "$target" "$old"; fi
      rm -f "$venv_root/run/$(basename "$old")"-* "$lock"
      echo "$venv_name venv: removed $old (not among the $keep most recently used)" >&2
    fi
    exec {fd}>&-
  done
}

if venv_ready; then
  echo "$venv_name venv: cached at $venv" >&2
  venv_prune
  venv_print_wrapper
fi
exec {venv_lock_fd}>>"$venv_lockfile"
if ! flock -n -x "$venv_lock_fd"; then
  echo "$venv_name venv: waiting for another build of $venv" >&2
  flock -x "$venv_lock_fd"
fi
if venv_ready; then
  exec {venv_lock_fd}>&-
  echo "$venv_name venv: cached at $venv" >&2
  venv_prune
  venv_print_wrapper
fi
# ours to (re)make: an unfinished build, or a link to a legacy venv since rebuilt for other pins
if [ -L "$venv" ]; then rm -f "$venv"; else rm -rf "$venv"; fi
if venv_adopt_legacy; then
  exec {venv_lock_fd}>&-
  venv_prune
  venv_print_wrapper
fi
echo "$venv_name venv: building $venv" >&2
t0=$SECONDS
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
# this repository as a package only (no .git, venvs or caches): pip/uv may write build/ and *.egg-info beside it
tar -C "$repo" -cf - --exclude=__pycache__ pyproject.toml setup.py README.md otel_agentloop otel_agentloop_startup.py \
  otel_agentloop_startup.pth otel_agentloop_switch.py | tar -C "$copy" -xf -

# finish a build: drop this package's modules (its metadata stays), mark the venv ready, prune, print the wrapper
venv_done() {
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$site/otel_agentloop" "$site/otel_agentloop_startup.py" "$site/otel_agentloop_switch.py" \
    "$site"/__editable__*otel_agentloop* "$site"/__pycache__/otel_agentloop_*
  if (cd / && "$venv/bin/python" -c "import otel_agentloop" 2>/dev/null); then
    echo "$venv_name venv: FAILED: it still imports otel_agentloop without a checkout" >&2
    exit 1
  fi
  echo "$venv_key" >"$venv/.key"
  echo "$venv_name venv: built in $((SECONDS - t0)) s at $venv ($(du -sh "$venv" | cut -f1))" >&2
  exec {venv_lock_fd}>&-
  venv_prune
  venv_print_wrapper
}
