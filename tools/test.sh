#!/usr/bin/env bash
# Every test: set up, build, run the whole CTest suite (GoogleTest suites and
# the demo check). Fails if no test ran.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
build=${HPAC_BUILD_DIR:-$root/build}
cd "$build"
ctest --output-on-failure -j "${HPAC_JOBS:-$(nproc)}" | tee "$build/ctest.log"
total=$(sed -n 's/.*tests passed, [0-9]* tests failed out of \([0-9]*\).*/\1/p' "$build/ctest.log")
if [ -z "$total" ] || [ "$total" -eq 0 ]; then
  echo "[hpac test] no tests ran" >&2
  exit 1
fi
