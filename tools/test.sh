#!/usr/bin/env bash
# Every test: set up, build, run the whole CTest suite (GoogleTest suites, the
# Python tests, the demo checks), then the core's GoogleTest suites again in an
# AddressSanitizer + UndefinedBehaviorSanitizer build. Fails if no test ran.
# HPAC_SKIP_SANITIZER=1 skips the sanitizer stage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
build=${HPAC_BUILD_DIR:-$root/build}
jobs=${HPAC_JOBS:-$(nproc)}
(cd "$build" && ctest --output-on-failure -j "$jobs" | tee "$build/ctest.log")
total=$(sed -n 's/.*tests passed, [0-9]* tests failed out of \([0-9]*\).*/\1/p' "$build/ctest.log")
if [ -z "$total" ] || [ "$total" -eq 0 ]; then
  echo "[hpac test] no tests ran" >&2
  exit 1
fi

if [ "${HPAC_SKIP_SANITIZER:-0}" != 1 ]; then
  asan=${build}-asan
  echo "[hpac test] sanitizer stage: ASan + UBSan build of the core and its tests in $asan"
  cmake -S "$root" -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHPAC_SANITIZE=ON >"$asan.configure.log" 2>&1 || {
    cat "$asan.configure.log" >&2
    exit 1
  }
  cmake --build "$asan" -j "$jobs" --target hpac_tests
  # No suppressions are needed: LeakSanitizer and UBSan report nothing for hpac's
  # code against Debian's (uninstrumented) libtorch. halt_on_error keeps CI honest.
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$asan/test/hpac_tests" --gtest_brief=1
  echo "[hpac test] sanitizer stage passed"
fi
echo "[hpac test] all passed ($total CTest entries + sanitizer stage)"
