#!/usr/bin/env bash
# Debian's chromium and chromium-driver for the browser test (tests/analysis/test_timeline_page.py). Idempotent and
# quiet: does nothing when both are on PATH; otherwise installs them with apt-get (as root, or through sudo).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium: no apt-get here; install chromium and its chromedriver by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install_chromium: need root (or password-less sudo) to apt-get install chromium" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver; } >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  exit 1
fi
echo "install_chromium: $(chromium --version 2>/dev/null | head -n 1)"
