#!/usr/bin/env bash
# Fails fast, naming the Debian package, when a tool or header a test stage needs is missing: each check compiles
# (and where it matters links and runs) a few lines the way the stage will, so a missing header, runtime or library
# shows up in seconds instead of after the long builds. tools/test.sh runs it right after tools/setup.sh; run it by
# hand after changing the set-up. It installs nothing: a failure means tools/setup.sh lacks a package.
# Usage: tools/preflight.sh [STAGE...]   STAGE: build, fuzz, sanitizer (default: all three)
# Environment: HPAC_FUZZ_CXX (default clang++-14, as tools/fuzz.sh), CXX (default g++, as CMake's default here).
set -euo pipefail
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build fuzz sanitizer)
cxx=${CXX:-g++}
clang=${HPAC_FUZZ_CXX:-clang++-14}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
declare -A compiler_package=(["$cxx"]=g++ ["$clang"]=clang-14)

# check STAGE PACKAGE WHAT COMPILER FLAGS... -- SOURCE [RUN_ARGS...]: compiles SOURCE to an executable with COMPILER
# FLAGS and runs it with RUN_ARGS; on failure prints the package that provides WHAT and the compiler's first error.
check() {
  local stage=$1 package=$2 what=$3 compiler=$4
  shift 4
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  local source=$2 name=check$RANDOM
  shift 2
  if ! command -v "$compiler" >/dev/null 2>&1; then
    echo "[hpac preflight] $stage: $compiler not found; install Debian's ${compiler_package[$compiler]:-$compiler} (tools/setup.sh should have)" >&2
    failed=1
    return
  fi
  printf '%s\n' "$source" >"$work/$name.cpp"
  if ! "$compiler" "$work/$name.cpp" -o "$work/$name" "${flags[@]}" >"$work/$name.log" 2>&1 ||
     ! (cd "$work" && ASAN_OPTIONS=detect_leaks=0 "./$name" "$@" >>"$name.log" 2>&1); then
    echo "[hpac preflight] $stage: $what missing for $compiler; install Debian's $package (tools/setup.sh should have):" >&2
    grep -m 3 -E 'error|cannot|undefined' "$work/$name.log" | sed 's/^/    /' >&2 || head -n 3 "$work/$name.log" >&2
    failed=1
  fi
}

for stage in "${stages[@]}"; do
  case "$stage" in
    build)
      check build libabsl-dev "abseil headers and libraries" "$cxx" -std=c++17 -labsl_strings -- \
        '#include "absl/strings/str_cat.h"
int main() { return absl::StrCat("a", 1).size() == 2 ? 0 : 1; }'
      check build libyaml-cpp-dev "yaml-cpp" "$cxx" -std=c++17 -lyaml-cpp -- \
        '#include <yaml-cpp/yaml.h>
int main() { return YAML::Load("a: 1")["a"].as<int>() == 1 ? 0 : 1; }'
      check build "libgtest-dev libgmock-dev" "GoogleTest / GoogleMock" "$cxx" -std=c++17 -lgmock -lgtest -pthread -- \
        '#include <gmock/gmock.h>
#include <gtest/gtest.h>
int main() { return 0; }'
      check build libbenchmark-dev "Google Benchmark" "$cxx" -std=c++17 -lbenchmark -pthread -- \
        '#include <benchmark/benchmark.h>
int main() { return 0; }'
      ;;
    fuzz)
      # libFuzzer's runtime (libfuzzer-14-dev) and clang's own sanitizer headers and runtimes (libclang-rt-14-dev,
      # in clang's resource directory: absl's headers include <sanitizer/asan_interface.h> under -fsanitize=address).
      check fuzz libclang-rt-14-dev "clang's sanitizer headers and runtimes (sanitizer/asan_interface.h)" "$clang" \
        -fsanitize=address,undefined -- \
        '#include <sanitizer/asan_interface.h>
int main() { return 0; }'
      check fuzz libfuzzer-14-dev "libFuzzer" "$clang" -fsanitize=fuzzer,address -- \
        '#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' -runs=1
      ;;
    sanitizer)
      # The sanitizer stage builds with the default compiler: gcc's ASan and UBSan runtimes (libasan8, libubsan1,
      # both pulled in by libgcc-12-dev, which g++ depends on).
      check sanitizer "libasan8 libubsan1" "gcc's AddressSanitizer / UndefinedBehaviorSanitizer runtimes" "$cxx" \
        -fsanitize=address,undefined -- \
        '#include <sanitizer/asan_interface.h>
int main() { return 0; }'
      ;;
    *)
      echo "[hpac preflight] stage '$stage' is not allowed; allowed: build, fuzz, sanitizer" >&2
      exit 2
      ;;
  esac
done
[ "$failed" = 0 ] || { echo "[hpac preflight] failed: install the packages named above, or fix tools/setup.sh" >&2; exit 1; }
echo "[hpac preflight] ${stages[*]}: toolchain complete"
