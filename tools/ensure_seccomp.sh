#!/usr/bin/env bash
# Make libseccomp's own Python bindings importable in the virtual environment: grading applies a
# seccomp filter to every process that runs student code (attention_book.classroom.sandbox).
# `make` runs it when it creates .venv; `make autograde` and `make test` run it again (a no-op
# once the module imports).
#
# Usage: tools/ensure_seccomp.sh [PYTHON]   (default: .venv/bin/python)
#
# On Debian and Ubuntu it installs the distribution's python3-seccomp (libseccomp's bindings,
# built for the system's Python 3) with apt-get, as root or through password-less sudo, and
# links its module into the environment's site-packages when the minor Python versions match
# (the extension module's ABI is that of the minor version). Elsewhere it installs pyseccomp
# from PyPI (a ctypes binding with the same API), which needs the libseccomp2 shared library.
# With CI=true a binding that cannot be provided fails; elsewhere this script warns, and
# `autograde` then refuses to grade without --unsafe-no-isolation (see the instructor guide).
set -euo pipefail

python="${1:-.venv/bin/python}"
imports() { "$python" -c 'import seccomp' >/dev/null 2>&1 || "$python" -c 'import pyseccomp' >/dev/null 2>&1; }
if imports; then
  exit 0
fi

site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
tag="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
module="/usr/lib/python3/dist-packages/seccomp${tag}"

if [ ! -f "$module" ] && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(false)
  fi
  if [ "${as_root[*]:-}" != "false" ]; then
    echo "Installing Debian's python3-seccomp (libseccomp's Python bindings) for grading..."
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-seccomp >/dev/null
  fi
fi
if [ -f "$module" ]; then
  ln -sf "$module" "$site/seccomp${tag}"
  if imports; then
    exit 0
  fi
  rm -f "$site/seccomp${tag}"
fi
# No Debian module for this Python: pyseccomp from PyPI (same API, through ctypes).
"$python" -m pip install --quiet "pyseccomp==0.1.2" >/dev/null 2>&1 || true
if imports; then
  exit 0
fi

message="no seccomp bindings for $python: install Debian's python3-seccomp (as root: apt-get"
message+=" install python3-seccomp) or 'pip install pyseccomp' with libseccomp2 present"
if [ "${CI:-}" = "true" ]; then
  echo "error: ${message} (CI=true: grading without a syscall filter is a failure)" >&2
  exit 1
fi
echo "warning: ${message}; autograde will refuse to grade without --unsafe-no-isolation" >&2
