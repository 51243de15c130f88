#!/usr/bin/env bash
# Make sure a Chromium is there for the browser tests (tests/test_browser.py); `make test` runs it.
#
# On Debian (and Ubuntu) it installs the distribution's `chromium` package with apt-get, as root
# or through password-less sudo. Set CHROMIUM to a Chromium or Chrome binary to use that one.
# With CI=true a browser that cannot be provided fails the run; elsewhere this script warns, and
# the browser tests then fail with the same advice (they never skip).
set -euo pipefail

if [ -n "${CHROMIUM:-}" ] && [ -x "${CHROMIUM}" ]; then
  exit 0
fi
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(false)
  fi
  if [ "${as_root[*]:-}" != "false" ]; then
    echo "Installing Debian's chromium for the browser tests..."
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    if command -v chromium >/dev/null 2>&1; then
      exit 0
    fi
  fi
fi

message="no chromium for the browser tests: install Debian's package (as root:"
message+=" apt-get update && apt-get install -y chromium) or set CHROMIUM to a Chromium binary"
if [ "${CI:-}" = "true" ]; then
  echo "error: ${message} (CI=true: a missing browser is a failure)" >&2
  exit 1
fi
echo "warning: ${message}; the browser tests will fail" >&2
