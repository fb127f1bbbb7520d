#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, clang-14) of hpac's parsers: the trainer's
# YAML config, the model registry, the op-name syntax of save lists (test/fuzz/).
# Usage: tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  default 30 (tools/test.sh's seeded short run)
#   TARGET              config, registry, op_name, step_record (default: all four)
# Needs an hpac build against pip torch (tools/build.sh; HPAC_BUILD_DIR, default
# build/): the parsers are compiled here, instrumented; the rest is linked from
# it. Builds into <build>-fuzz/. Each target starts from its checked-in corpus
# (test/fuzz/corpus/<target>, read only) with a fixed seed (HPAC_FUZZ_SEED); new
# inputs go to <build>-fuzz/corpus/<target>. A finding (crash, sanitizer
# report, escaped exception, refusal without a position) fails the script and
# leaves the input in <build>-fuzz/ (crash-*, leak-*, timeout-*).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config registry op_name step_record)
build=${HPAC_BUILD_DIR:-$root/build}
out=$build-fuzz
jobs=${HPAC_JOBS:-$(nproc)}
python=${HPAC_TORCH_PYTHON:-$root/.venv/bin/python}
clang=${HPAC_FUZZ_CXX:-clang++-14}
command -v "$clang" >/dev/null || { echo "[hpac fuzz] $clang not found (tools/setup.sh installs clang-14 and libfuzzer-14-dev)" >&2; exit 1; }
prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$root/test/fuzz" -B "$out" -DCMAKE_CXX_COMPILER="$clang" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHPAC_BUILD_DIR="$build" -DCMAKE_PREFIX_PATH="$prefix" -Dc10_LIBRARY="$lib/libc10.so" \
  -DTORCH_LIBRARY="$lib/libtorch.so" "${launcher[@]}" >"$out.configure.log" 2>&1 || {
  cat "$out.configure.log" >&2
  exit 1
}
cmake --build "$out" -j "$jobs" --target $(printf '%s_fuzzer ' "${targets[@]}")
# fuzz_one TARGET: one seeded run; its summary line, or the finding (exit 1).
fuzz_one() {
  local t=$1 log=$out/$1.log runs cov ft
  mkdir -p "$out/corpus/$t"
  echo "[hpac fuzz] $t: ${seconds} s from test/fuzz/corpus/$t ($(ls "$root/test/fuzz/corpus/$t" | wc -l) seeds)"
  if ! (cd "$out" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "./${t}_fuzzer" -seed="${HPAC_FUZZ_SEED:-20261203}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
      -print_final_stats=1 "corpus/$t" "$root/test/fuzz/corpus/$t" >"$log" 2>&1); then
    tail -n 60 "$log" >&2
    echo "[hpac fuzz] $t: FINDING (log $log; the input is in $out)" >&2
    return 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1)
  echo "[hpac fuzz] $t: $runs executions, $cov edges, $ft features, corpus $(ls "$out/corpus/$t" | wc -l) new inputs, no finding"
}
# The targets run $jobs at a time (each is one thread for its SECONDS), each into its own log and corpus.
pids=() failed=0
for t in "${targets[@]}"; do
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$t" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || exit 1
