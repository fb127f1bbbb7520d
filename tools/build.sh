#!/usr/bin/env bash
# Configures and builds hpac (installs what is missing first, tools/setup.sh).
# Usage: tools/build.sh [--torch pip|debian] [extra cmake args...]
#   --torch pip     (default) torch 2.13.0 from the project's .venv, through its
#                   CMake config (torch.utils.cmake_prefix_path); into build/
#   --torch debian  Debian's libtorch 1.13.1 (the compatibility leg); into
#                   build-torch1.13/
# Another torch: HPAC_TORCH_PYTHON=<python whose torch to use> with --torch pip.
# HPAC_BUILD_DIR overrides the build folder, HPAC_JOBS the parallel jobs,
# HPAC_BUILD_TARGETS (space-separated) builds only those targets.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch_kind=pip
if [ "${1:-}" = "--torch" ]; then
  torch_kind=${2:-}
  shift 2 || true
fi
"$root/tools/setup.sh"
jobs=${HPAC_JOBS:-$(nproc)}
case "$torch_kind" in
  pip)
    python=${HPAC_TORCH_PYTHON:-$root/.venv/bin/python}
    build=${HPAC_BUILD_DIR:-$root/build}
    # CMakeLists.txt asks that Python for its torch's CMake config and names the wheel's libc10/libtorch
    # (TorchConfig's find_library would take Debian's libc10.so first).
    torch_args=(-DHPAC_TORCH_PYTHON="$python" -DHPAC_PYTHON="$python")
    ;;
  debian)
    python=/usr/bin/python3
    build=${HPAC_BUILD_DIR:-$root/build-torch1.13}
    torch_args=(-DHPAC_PYTHON="$python")
    ;;
  *)
    echo "[hpac build] --torch '$torch_kind' is not allowed; allowed: pip (torch 2.13 in .venv), debian (libtorch 1.13)" >&2
    exit 2
    ;;
esac
# ccache, where installed, makes a rebuild in a fresh clone or a second checkout cheap; it changes no output.
# The targets with precompiled headers (the core's and the trainer's tests, the trainer library) are cacheable
# only with this sloppiness; the PCH is rebuilt when a header changes and its content is hashed with each object.
if command -v ccache >/dev/null 2>&1; then
  torch_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
  # Paths under the checkout are hashed relative to it, and the working directory not at all, so that a clean clone
  # elsewhere (CI) hits what an earlier checkout cached (debug info then names the checkout that filled the cache).
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
echo "[hpac build] configuring $build ($("$python" -c 'import torch; print("torch", torch.__version__)'))"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${torch_args[@]}" "$@" >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log" >&2
  exit 1
}
echo "[hpac build] building with $jobs jobs"
start=$(date +%s)
targets=()
for t in ${HPAC_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"
echo "[hpac build] done in $(( $(date +%s) - start )) s"
