#!/usr/bin/env bash
# Every test (CI runs exactly this). Set up, then two torch legs, packaging, fuzzing and a sanitizer stage:
#  1. torch 2.13 (pip, .venv; build/): everything built, every CTest entry run (GoogleTest suites, trainer,
#     distributed, Python tests including context_fn and PyTorch's own SAC as the peer, demo checks);
#  2. torch 1.13.1 (Debian; build-torch1.13/): the compatibility leg, the core's GoogleTest suites, the Python
#     tests and the LD_PRELOAD tests (no trainer, benchmarks or multi-rank tests);
#  P. packaging (tools/package_test.sh): the pip wheel built against torch 2.13, made self-contained by auditwheel
#     (manylinux tag; yaml-cpp and abseil bundled, torch's libraries not) and smoke-tested in a fresh venv with the
#     build machine's yaml-cpp and abseil hidden; the sdist (twine check) built from source and smoke-tested;
#     cmake --install of build/, the installed CLIs' --version, and examples/cmake_consumer built against it;
#  3. libFuzzer: the config, registry and op-name parsers, ~30 s each from the checked-in corpus (tools/fuzz.sh);
#  4. every GoogleTest suite again (core hpac_tests, trainer hpac_trainer_tests, fuzz hpac_fuzz_tests) in one
#     AddressSanitizer + UndefinedBehaviorSanitizer build on pip torch (build-asan/).
# Each leg's Python tests also load the other leg's libhpac.so, which must be refused naming both versions.
# Fails if a leg ran no test. HPAC_SKIP_FUZZ=1 skips stage 3, HPAC_SKIP_SANITIZER=1 stage 4.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${HPAC_JOBS:-$(nproc)}
pip_build=$root/build
debian_build=$root/build-torch1.13
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }
# stage NAME: ends the stage running so far (its seconds go to the summary printed at the end) and starts NAME.
stage_names=() stage_seconds=() stage_name="" stage_start=$start
stage() {
  local now
  now=$(date +%s)
  [ -z "$stage_name" ] || { stage_names+=("$stage_name"); stage_seconds+=($((now - stage_start))); }
  stage_name=$1 stage_start=$now
}
stage "set-up + preflight"

# Set up first, then check in seconds that every tool and header the stages below need is there (tools/preflight.sh
# names the missing package), rather than failing in the middle of a long build.
"$root/tools/setup.sh"
preflight=(build)
[ "${HPAC_SKIP_FUZZ:-0}" = 1 ] || preflight+=(fuzz)
[ "${HPAC_SKIP_SANITIZER:-0}" = 1 ] || preflight+=(sanitizer)
"$root/tools/preflight.sh" "${preflight[@]}"

stage "build (torch 2.13)"
HPAC_BUILD_DIR=$pip_build "$root/tools/build.sh" --torch pip
stage "build (torch 1.13)"
HPAC_BUILD_DIR=$debian_build "$root/tools/build.sh" --torch debian -DHPAC_WITH_TRAINER=OFF -DHPAC_WITH_BENCH=OFF

# run_leg NAME BUILD FOREIGN_LIBRARY [ctest args...]: runs the leg's CTest entries, prints and returns the count.
total=0
run_leg() {
  local name=$1 build=$2 foreign=$3
  shift 3
  stage "tests: $name"
  echo "[hpac test] leg $name ($(elapsed) so far)"
  (cd "$build" && HPAC_FOREIGN_LIBRARY=$foreign ctest --output-on-failure -j "$jobs" "$@" | tee "$build/ctest.log")
  local n
  n=$(sed -n 's/.*tests passed.* out of \([0-9]*\).*/\1/p' "$build/ctest.log")  # ctest 3.x and 4.x wording
  if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo "[hpac test] leg $name ran no tests" >&2
    exit 1
  fi
  echo "[hpac test] leg $name: $n CTest entries passed"
  total=$((total + n))
}
run_leg "torch 2.13 (pip)" "$pip_build" "$debian_build/plugin/libhpac.so"
# Multi-rank tests run on the torch 2.13 leg only.
run_leg "torch 1.13 (Debian)" "$debian_build" "$pip_build/plugin/libhpac.so" -E '^dist\.'

# ---- packaging stage: pip wheel + fresh venv, cmake --install + find_package(hpac) consumer ------------------------
stage "packaging"
echo "[hpac test] packaging stage ($(elapsed) so far)"
HPAC_BUILD_DIR=$pip_build HPAC_FOREIGN_BUILD=$debian_build "$root/tools/package_test.sh"
echo "[hpac test] packaging stage passed"
# ---- end of the packaging stage ------------------------------------------------------------------------------------
# Coverage-guided fuzzing, short and seeded: each parser ~30 s from its checked-in corpus (tools/fuzz.sh).
if [ "${HPAC_SKIP_FUZZ:-0}" != 1 ]; then
  stage "libFuzzer (build + runs)"
  echo "[hpac test] libFuzzer stage ($(elapsed) so far)"
  HPAC_BUILD_DIR=$pip_build "$root/tools/fuzz.sh" "${HPAC_FUZZ_SECONDS:-30}"
fi

if [ "${HPAC_SKIP_SANITIZER:-0}" != 1 ]; then
  # Every GoogleTest suite (core, trainer, fuzz) in one ASan + UBSan build on pip torch (the trainer is built only
  # there): hpac's code instrumented, libtorch not. Only the three test targets and what they link are built, at -O1
  # with line tables only (-g1: file:line in reports; less to compile and link than -O2 -g).
  # CCACHE_NOHASHDIR: objects cached in another checkout serve this one (their debug info names that checkout's paths).
  asan=${pip_build}-asan
  suites=(test/hpac_tests test/trainer/hpac_trainer_tests test/hpac_fuzz_tests)
  stage "sanitizer build"
  echo "[hpac test] sanitizer stage: ASan + UBSan build of every GoogleTest suite in $asan ($(elapsed) so far)"
  CCACHE_NOHASHDIR=1 HPAC_BUILD_DIR=$asan HPAC_BUILD_TARGETS="hpac_tests hpac_trainer_tests hpac_fuzz_tests" \
    "$root/tools/build.sh" --torch pip -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DHPAC_SANITIZE=ON -DHPAC_WITH_BENCH=OFF -DHPAC_WITH_TRAINER=ON  # explicit: a build-asan/ configured earlier keeps its cache
  # halt_on_error keeps CI honest; LeakSanitizer on. See docs/reliability.md for what they report. The suites run at
  # the same time (the core's is the longest, the trainer's and the fuzz suite's together about as long), each into
  # its log; a failing suite's log is printed whole.
  stage "sanitizer runs"
  echo "[hpac test] sanitizer stage: running ${suites[*]} ($(elapsed) so far)"
  pids=()
  for suite in "${suites[@]}"; do
    ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$asan/$suite" --gtest_brief=1 >"$asan/$suite.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for i in "${!suites[@]}"; do
    if wait "${pids[$i]}"; then
      echo "[hpac test] sanitizer stage: ${suites[$i]}: $(grep -h 'PASSED' "$asan/${suites[$i]}.log")"
    else
      cat "$asan/${suites[$i]}.log" >&2
      echo "[hpac test] sanitizer stage: ${suites[$i]} FAILED (log above, $asan/${suites[$i]}.log)" >&2
      failed=1
    fi
  done
  [ "$failed" = 0 ] || exit 1
  echo "[hpac test] sanitizer stage passed ($(elapsed) so far)"
fi
stage ""
for i in "${!stage_names[@]}"; do printf '[hpac test] %6d s  %s\n' "${stage_seconds[$i]}" "${stage_names[$i]}"; done
echo "[hpac test] all passed in $(elapsed): $total CTest entries over both torch legs + fuzz and sanitizer stages"
