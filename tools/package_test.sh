#!/usr/bin/env bash
# The packaged hpac, as users get it (tools/test.sh runs this after the torch 2.13 leg; it reuses that leg's
# build/ for the C++ install):
#  1. Python: pip wheel --no-build-isolation builds the wheel against .venv's torch (core only, pyproject.toml) in
#     build-wheel/ (beside build/, at its depth, so that ccache, where installed, serves the compiles build/ made);
#     auditwheel repair bundles yaml-cpp and abseil (not torch's libraries) and gives it its manylinux tag; a fresh
#     virtual environment gets the pinned torch and transformers (tools/requirements.txt) and the wheel, and runs
#     test/package/wheel_smoke.py there (isolated mode), hpac.hf on a transformers model included, with the build
#     machine's yaml-cpp and abseil hidden from the loader; then the sdist (build, twine check) is installed in its
#     place from source and smoke-tested the same way;
#  2. C++: cmake --install build/ into build/install, the installed CLIs' --version, and examples/cmake_consumer
#     configured with find_package(Torch) + find_package(hpac) against that install, built and run (a checkpointed
#     step under each policy with parity to off).
#     With HPAC_FOREIGN_BUILD (a tree built against another torch), find_package(hpac) beside that torch must fail.
# Usage: tools/package_test.sh  (after tools/build.sh). HPAC_BUILD_DIR: the built tree (default build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HPAC_BUILD_DIR:-$root/build}
python=$root/.venv/bin/python
jobs=${HPAC_JOBS:-$(nproc)}
start=$(date +%s)
stage() { echo "[hpac package] $1 ($(( $(date +%s) - start )) s so far)"; }
launcher=() wheel_launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  wheel_launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# The built tree's configuration: the torch it was built against (the consumer must find the same: its CMake
# prefix, torch.utils.cmake_prefix_path, is Torch_DIR's parent) and its generator.
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
version=$(sed -n 's/^project(hpac VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")

# --- 1. the wheel in a fresh virtual environment ------------------------------------------------------------------
stage "building the wheel against $("$python" -c 'import torch; print("torch", torch.__version__)')"
dist=$build/dist
rm -rf "$dist"
# The same generator as build/ (scikit-build-core would pick Ninja): identical compile lines, so ccache hits.
# CMAKE_BUILD_PARALLEL_LEVEL: without it the build scikit-build-core runs compiles one file at a time.
CMAKE_GENERATOR=$(cached CMAKE_GENERATOR) CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$python" -m pip wheel -q --no-build-isolation --no-deps -w "$dist" -C build-dir="$build-wheel" \
  "${wheel_launcher[@]}" "$root" >"$build/wheel.log" 2>&1 || {
  cat "$build/wheel.log" >&2
  exit 1
}
raw=$(ls "$dist"/hpac-"$version"-*.whl)
# auditwheel (pinned in tools/requirements.txt) bundles yaml-cpp and abseil, never torch's libraries, and gives the
# manylinux tag (tools/packaging/repair_wheel.sh).
stage "auditwheel repair $(basename "$raw") (torch's libraries excluded)"
wheel=$("$root/tools/packaging/repair_wheel.sh" "$python" "$raw" "$dist/repaired" "$build/auditwheel.log")
files=$("$python" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel")
# auditwheel show (no --exclude there; torch's libraries kept out of its search path): the symbols allow the wheel's
# tag, and nothing outside the policy is left but torch's own libraries.
mkdir -p "$build/no-ldpaths"
"$python" -m auditwheel show --json --ldpaths "$build/no-ldpaths" "$wheel" | "$python" -c '
import fnmatch, json, sys
show, tag = json.load(sys.stdin), sys.argv[1].rsplit("-", 1)[-1][:-len(".whl")]
sym, libs = show["sym_tag"], sorted(show["external_libs"])
others = [lib for lib in libs if not fnmatch.fnmatch(lib, "libtorch*") and not fnmatch.fnmatch(lib, "libc10*")]
print(f"[hpac package] auditwheel show: symbols allow {sym}; outside the policy: {libs} (torch provides them)")
if sym != tag or others:
    sys.exit(f"[hpac package] auditwheel show: the wheel is tagged {tag}, its symbols allow {sym}; libraries "
             f"outside the policy besides torch: {others}")
' "$wheel"
echo "$files" | grep -q '^hpac\.libs/libyaml-cpp' || {
  echo "[hpac package] $(basename "$wheel") carries no yaml-cpp in hpac.libs/" >&2
  exit 1
}
if echo "$files" | grep -E 'lib(torch|c10)[^/]*\.so'; then
  echo "[hpac package] $(basename "$wheel") carries torch's own libraries (above)" >&2
  exit 1
fi
stage "built $(basename "$wheel"); installing it with the pinned torch and transformers into a fresh venv"
venv=$build/wheel-venv
rm -rf "$venv"
"$python" -m venv "$venv"
# --no-compile: no .pyc for torch's thousands of modules (a large part of the install time; Python compiles on use).
# transformers (pinned, with numpy) for the smoke test's hpac.hf check; hpac itself needs only torch.
pins=()
for package in torch numpy transformers; do pins+=("$(grep -E "^$package==" "$root/tools/requirements.txt")"); done
"$venv/bin/python" -m pip install -q --no-compile "$wheel" "${pins[@]}" \
  >"$build/wheel-venv.log" 2>&1 || {
  cat "$build/wheel-venv.log" >&2
  exit 1
}
# The build machine's yaml-cpp and abseil out of the loader's reach (Debian's libyaml-cpp0.7 and libabsl20220623, as
# on a machine without them): in a mount namespace of its own, each of their files is /dev/null, so a library that
# still needed one would fail to load. ldd first, then the smoke test, in that namespace.
hidden=$(ls /usr/lib/*-linux-gnu/libyaml-cpp.so* /usr/lib/*-linux-gnu/libabsl_*.so* 2>/dev/null | xargs -r readlink -f \
  | sort -u | tr '\n' ' ' || true)
# unshare -m makes every mount private to the new namespace; inside a chroot (tools' fresh root) / is no mount point
# and that step fails, so the mounts keep their propagation there and are taken down again before the namespace ends.
namespace=()
for try in "unshare -m" "unshare -m --propagation unchanged" "unshare -rm"; do
  if $try true 2>/dev/null; then read -r -a namespace <<<"$try"; break; fi
done
[ ${#namespace[@]} -gt 0 ] || {
  echo "[hpac package] no mount namespace (unshare -m, as root or in a user namespace): cannot hide the build" \
       "machine's yaml-cpp and abseil from the smoke test" >&2
  exit 1
}
stage "smoke test of the installed wheel, the build machine's yaml-cpp and abseil hidden ($(echo $hidden | wc -w) files, ${namespace[*]})"
"${namespace[@]}" bash -c '
  set -euo pipefail
  trap "for f in '"$hidden"'; do umount \"\$f\" 2>/dev/null || true; done" EXIT
  for f in '"$hidden"'; do mount --bind /dev/null "$f"; done
  for lib in "$1"/lib/python3*/site-packages/hpac/lib/*.so; do
    if ldd "$lib" | grep -E "yaml-cpp|absl" | grep -v "hpac\.libs/"; then
      echo "[hpac package] $lib needs the build machine'"'"'s yaml-cpp or abseil (above)" >&2
      exit 1
    fi
  done
  cd "$1" && env -u HPAC_LIBRARY -u HPAC_CONFIG_LIBRARY "$1/bin/python" -I "$2"
' hidden "$venv" "$root/test/package/wheel_smoke.py"

# The source distribution: made with build (scikit-build-core's sdist), checked with twine, installed into the same
# venv in place of the wheel (no build isolation: against its torch) and smoke-tested the same way.
stage "sdist: python -m build --sdist, twine check"
"$python" -m build --sdist --no-isolation -o "$dist" "$root" >"$build/sdist.log" 2>&1 || {
  cat "$build/sdist.log" >&2
  exit 1
}
sdist=$(ls "$dist"/hpac-"$version".tar.gz)
"$python" -m twine check --strict "$sdist" "$wheel"
stage "pip install --no-build-isolation $(basename "$sdist") (a build from source)"
"$venv/bin/python" -m pip uninstall -q -y hpac
sdist_pins=()
# pip itself first among them: a venv made by Debian's python3 starts with pip 23.0.1, which has no -C (23.1 and newer)
for package in pip scikit-build-core pathspec; do sdist_pins+=("$(grep -E "^$package==" "$root/tools/requirements.txt")"); done
"$venv/bin/python" -m pip install -q --no-compile "${sdist_pins[@]}" >"$build/sdist-venv.log" 2>&1 &&
CMAKE_GENERATOR=$(cached CMAKE_GENERATOR) CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv/bin/python" -m pip install -q --no-compile --no-build-isolation \
  --no-deps "${wheel_launcher[@]}" "$sdist" >>"$build/sdist-venv.log" 2>&1 || {
  cat "$build/sdist-venv.log" >&2
  exit 1
}
stage "smoke test of hpac built from the sdist"
(cd "$venv" && env -u HPAC_LIBRARY -u HPAC_CONFIG_LIBRARY "$venv/bin/python" -I "$root/test/package/wheel_smoke.py")

# --- 2. cmake --install and a consumer project --------------------------------------------------------------------
prefix=$build/install
stage "cmake --install $build into $prefix"
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >"$build/install.log"
for tool in hpac-demo hpac-launch hpac-train; do
  line=$("$prefix/bin/$tool" --version)
  echo "$line"
  case "$line" in
    "$tool $version"*) ;;
    *) echo "[hpac package] $tool --version printed '$line'; expected '$tool $version ...'" >&2; exit 1 ;;
  esac
  # Tools linking libhpac must run the installed one (RPATH $ORIGIN/../lib), not the build tree's.
  if [ "$tool" != hpac-launch ]; then
    loaded=$(echo "$line" | sed -n 's/.*(libhpac \(.*\), built for torch.*/\1/p')
    if [ -z "$loaded" ] || [ "$(realpath "$loaded")" != "$(realpath "$prefix/lib/libhpac.so")" ]; then
      echo "[hpac package] installed $tool does not load $prefix/lib/libhpac.so: $line" >&2
      exit 1
    fi
  fi
done
test -f "$prefix/share/hpac/model_registry.yaml"

consumer=$build/consumer
stage "examples/cmake_consumer against the installed hpac"
rm -rf "$consumer"
cmake -S "$root/examples/cmake_consumer" -B "$consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix;$(dirname "$(cached Torch_DIR)")" -Dc10_LIBRARY="$(cached c10_LIBRARY)" \
  -DTORCH_LIBRARY="$(cached TORCH_LIBRARY)" "${launcher[@]}" >"$consumer.configure.log" 2>&1 || {
  cat "$consumer.configure.log" >&2
  exit 1
}
cmake --build "$consumer" -j "$jobs" >"$consumer.build.log" 2>&1 || {
  cat "$consumer.build.log" >&2
  exit 1
}
"$consumer/hpac_consumer"
# find_package(hpac) beside another torch release must stop, naming both (HPAC_FOREIGN_BUILD: a tree built against
# another torch, e.g. tools/test.sh's build-torch1.13/; its cache names that torch's CMake config).
if [ -n "${HPAC_FOREIGN_BUILD:-}" ]; then
  foreign_torch=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$HPAC_FOREIGN_BUILD/CMakeCache.txt")
  stage "find_package(hpac) beside torch at $foreign_torch must be refused"
  if cmake -S "$root/examples/cmake_consumer" -B "$consumer-foreign" -DCMAKE_PREFIX_PATH="$prefix" \
       -DTorch_DIR="$foreign_torch" >"$consumer-foreign.log" 2>&1; then
    echo "[hpac package] the consumer configured against $foreign_torch; hpacConfig.cmake should have refused it" >&2
    exit 1
  fi
  tr -s ' \n' ' ' <"$consumer-foreign.log" | grep -o "was built for torch [0-9.]* but find_package(Torch) found torch [0-9.]*"
  rm -rf "$consumer-foreign"
fi
stage "passed"
