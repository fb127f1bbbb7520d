#!/usr/bin/env bash
# Configures and builds hpac into build/ (installs missing packages first).
# Usage: tools/build.sh [extra cmake args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh"
build=${HPAC_BUILD_DIR:-$root/build}
jobs=${HPAC_JOBS:-$(nproc)}
echo "[hpac build] configuring $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log" >&2
  exit 1
}
echo "[hpac build] building with $jobs jobs"
start=$(date +%s)
cmake --build "$build" -j "$jobs"
echo "[hpac build] done in $(( $(date +%s) - start )) s"
