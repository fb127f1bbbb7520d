#!/usr/bin/env bash
# hpac against a current torch release from pip (not part of tools/test.sh: a CUDA wheel's environment is ~5.5 GB and
# the run takes several minutes). For torch VERSION:
#  1. the virtual environment .venv-torchVERSION/ (ignored by git): pip's pinned release, torch==VERSION and the
#     rest of tools/requirements.txt (pytest, numpy, scikit-build-core, transformers, scipy);
#  2. tools/build.sh --torch pip against that Python's torch into build-torchVERSION/ (core + Python, as the
#     torch 1.13 leg: no trainer, no benchmarks; --with-trainer builds and tests the trainer too), timed;
#  3. CTest there (the core's GoogleTest suites, the Python tests, the LD_PRELOAD and docs checks; no multi-rank);
#  4. the pip path: `pip install --no-build-isolation .` into the same venv, `python -m hpac`, and
#     test/package/wheel_smoke.py (a checkpointed step under each policy, bitwise equal to off; hpac.hf); then the
#     self-contained wheel (pip wheel, tools/packaging/repair_wheel.sh: auditwheel, torch's libraries excluded) and
#     its manylinux tag;
#  5. one entry per VERSION in bench/results/torch_releases.json (docs/compatibility.md shows it), and a summary.
# A CUDA wheel (PyPI's default torch) builds on a machine without a GPU: tools/cmake/hpacTorchCuda.cmake points its
# CMake config at a CUDA toolkit found here and at the libnvrtc of the nvidia wheel beside torch.
# Where pip's configuration constrains torch below VERSION (a machine whose local wheels cap it), that constraint
# is lifted for this venv's installs only (PIP_CONSTRAINT=/dev/null in this script's pip calls).
#
# Usage: tools/torch_release_check.sh [--with-trainer] [--remove-after] VERSION     e.g. 2.14.1, 2.15.0
#   --with-trainer  also build the trainer (tools/trainer, test/trainer) and run its CTest entries
#   --remove-after  delete the venv and the build folder at the end (the result stays in the JSON)
# Environment: HPAC_JOBS (parallel jobs, default nproc), HPAC_VENV_PYTHON (the Python 3 that creates the venv;
# default python3), HPAC_RELEASE_RESULTS (the JSON; default bench/results/torch_releases.json).
# Exit status: 0 when every step passed, 1 when a step failed (the JSON records how far it got), 2 for bad usage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n 's/^# Usage: //p' "$0" >&2; }
with_trainer=0 remove_after=0 version=""
while [ $# -gt 0 ]; do
  case "$1" in
    --with-trainer) with_trainer=1 ;;
    --remove-after) remove_after=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "[hpac release] unknown option '$1'" >&2; usage; exit 2 ;;
    *)
      if [ -n "$version" ]; then
        echo "[hpac release] one VERSION only (got '$version' and '$1')" >&2; usage; exit 2
      fi
      version=$1 ;;
  esac
  shift
done
if [ -z "$version" ]; then
  echo "[hpac release] no torch VERSION given" >&2; usage; exit 2
fi
if ! [[ "$version" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "[hpac release] '$version' is not a torch release: expected MAJOR.MINOR.PATCH as on PyPI (e.g. 2.14.1," \
       "2.15.0), without a local suffix such as +cpu or +cu130" >&2
  exit 2
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
if [ "$major" -lt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -lt 13 ]; }; then
  echo "[hpac release] torch $version is older than 2.13: this script checks current releases (2.13.0 is" \
       "tools/test.sh's default leg, 1.13.1 its Debian leg: tools/build.sh --torch debian)" >&2
  exit 2
fi

venv=$root/.venv-torch$version
build=$root/build-torch$version
results=${HPAC_RELEASE_RESULTS:-$root/bench/results/torch_releases.json}
jobs=${HPAC_JOBS:-$(nproc)}
host_python=${HPAC_VENV_PYTHON:-python3}
log=$build.release.log  # beside the build folder, ignored by git (/build*.log)
start=$(date +%s)
step() { echo "[hpac release] $1 ($(( $(date +%s) - start )) s so far)"; }
fail() {
  echo "[hpac release] FAILED: $1" >&2
  [ -s "$2" ] && { echo "[hpac release] last lines of $2:" >&2; tail -n 40 "$2" >&2; }
  failed_step=$1
  # Only a torch that installed gets an entry (a version pip cannot find leaves the JSON as it was).
  [ -z "$torch_full" ] || record
  exit 1
}

# The result, filled in as the steps run; record() writes it at the end or at the failing step.
torch_full="" cuda="" python_version="" configure_s="" build_s="" ctest_passed="" ctest_total="" ctest_failed=""
pytest_passed="" pytest_failed="" pytest_skipped="" pip_ok="" pip_s="" smoke_ok="" hpac_info="" failed_step="" wheel_tag=""
record() {
  mkdir -p "$(dirname "$results")"
  python3 - "$results" <<EOF
import json, os, sys
path = sys.argv[1]
def num(s):
    return None if s == "" else int(s)
def flag(s):
    return None if s == "" else s == "1"
entry = {
    "version": "$version",
    "torch": "$torch_full" or None,
    "cuda_build": bool("$cuda") if "$torch_full" else None,
    "cuda": "$cuda" or None,
    "python": "$python_version" or None,
    "date": "$(date -u +%Y-%m-%d)",
    "commit": "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)",
    "tree_modified": bool("$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | head -1)"),
    "cpus": os.cpu_count(),
    "jobs": $jobs,
    "with_trainer": $with_trainer == 1,
    "configure_s": num("$configure_s"),
    "build_s": num("$build_s"),
    "ctest": {"passed": num("$ctest_passed"), "total": num("$ctest_total"),
              "failed": [t for t in "$ctest_failed".split(";") if t]},
    "pytest": {"passed": num("$pytest_passed"), "failed": num("$pytest_failed"), "skipped": num("$pytest_skipped")},
    "pip_install": {"ok": flag("$pip_ok"), "seconds": num("$pip_s"), "python_m_hpac": "$hpac_info" or None,
                    "wheel_smoke_ok": flag("$smoke_ok"), "wheel_tag": "$wheel_tag" or None},
    "failed_step": "$failed_step" or None,
    "total_s": $(( $(date +%s) - start )),
}
data = {"source": "tools/torch_release_check.sh VERSION, one entry per torch release (the latest run)",
        "releases": {}}
if os.path.exists(path):
    with open(path) as f:
        data = json.load(f)
data["releases"][entry["version"]] = entry
data["releases"] = dict(sorted(data["releases"].items(), key=lambda kv: [int(p) for p in kv[0].split(".")]))
with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
os.replace(path + ".tmp", path)
EOF
  echo "[hpac release] recorded torch $version in ${results#"$root"/}"
}

# --- 1. the venv -------------------------------------------------------------------------------------------------
step "torch $version: venv $(basename "$venv"), build folder $(basename "$build"), $jobs jobs"
mkdir -p "$(dirname "$build")"
: >"$log"
if [ ! -x "$venv/bin/python" ]; then
  "$host_python" -c 'import sys; sys.exit(0 if sys.version_info[0] == 3 else 1)' 2>/dev/null || {
    echo "[hpac release] HPAC_VENV_PYTHON=$host_python is not a Python 3" >&2; exit 2; }
  step "creating $(basename "$venv") with $("$host_python" --version 2>&1)"
  "$host_python" -m venv "$venv" >>"$log" 2>&1 || fail "creating the venv" "$log"
fi
py=$venv/bin/python
python_version=$("$py" -c 'import platform; print(platform.python_version())')
# The pins of tools/requirements.txt with torch==VERSION in place of the project's torch.
requirements=$venv/hpac-release-requirements.txt
{ grep -vE '^(torch==|#|$)' "$root/tools/requirements.txt"; echo "torch==$version"; } >"$requirements"
stamp=$venv/.hpac-release-requirements
# pip's configured constraint files (pip config list: *.constraint='FILE ...'): lifted for this venv's pip calls when
# one caps torch below VERSION (pip would refuse: "The user requested (constraint) torch<=...").
pip_env=()
capped=$("$py" - "$version" <<'EOF2'
import re, subprocess, sys
from pip._vendor.packaging.requirements import Requirement
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
files = [f for line in out.splitlines() if re.match(r"[^=]*constraint=", line)
         for f in line.split("=", 1)[1].strip("'\"").split()]
for path in files:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            r = Requirement(line)
            if r.name.lower() == "torch" and not r.specifier.contains(sys.argv[1], prereleases=True):
                print(f"{path} ({line})")
EOF2
) || capped=""
if [ -n "$capped" ]; then
  step "pip's configured constraint $capped excludes torch $version: lifted for this venv's pip calls"
  pip_env=(PIP_CONSTRAINT=/dev/null)
fi
if [ -f "$stamp" ] && cmp -s "$requirements" "$stamp"; then
  step "$(basename "$venv") already holds torch $version and the pins"
else
  pip_pin=$(grep -E '^pip==' "$requirements")
  step "installing $pip_pin, then torch==$version and tools/requirements.txt's other pins (a CUDA wheel: several GB)"
  env "${pip_env[@]}" "$py" -m pip install -q --disable-pip-version-check "$pip_pin" >>"$log" 2>&1 \
    || fail "installing $pip_pin" "$log"
  install_start=$(date +%s)
  env "${pip_env[@]}" "$py" -m pip install --disable-pip-version-check --no-compile -r "$requirements" >>"$log" 2>&1 \
    || fail "pip install torch==$version (pip's indexes and find-links: pip config list)" "$log"
  cp "$requirements" "$stamp"
  step "installed in $(( $(date +%s) - install_start )) s"
fi
read -r torch_full cuda < <("$py" -c 'import torch; print(torch.__version__, torch.version.cuda or "")' 2>>"$log") \
  || fail "import torch in $(basename "$venv")" "$log"
if [ "${torch_full%%+*}" != "$version" ]; then
  fail "$(basename "$venv") holds torch $torch_full, not $version" "$log"
fi
step "torch $torch_full ($([ -n "$cuda" ] && echo "CUDA $cuda build, run on CPU" || echo "CPU build")), Python $python_version"
# A previous run's pip-installed hpac would shadow the source tree's package in the Python tests.
"$py" -m pip uninstall -q -y hpac >>"$log" 2>&1 || true

# --- 2. build ------------------------------------------------------------------------------------------------------
cmake_args=(-DHPAC_WITH_BENCH=OFF)
[ "$with_trainer" = 1 ] || cmake_args+=(-DHPAC_WITH_TRAINER=OFF)
step "tools/build.sh --torch pip ${cmake_args[*]} (log: $(basename "$build").build.log)"
build_log=$build.build.log
build_start=$(date +%s)
building_at=""
: >"$build_log"
while IFS= read -r line; do
  echo "$line" >>"$build_log"
  case "$line" in
    "[hpac build] building with"*) building_at=$(date +%s); configure_s=$((building_at - build_start)); echo "$line" ;;
    "[hpac build] "*) echo "$line" ;;
  esac
done < <(HPAC_TORCH_PYTHON=$py HPAC_BUILD_DIR=$build HPAC_JOBS=$jobs \
           "$root/tools/build.sh" --torch pip "${cmake_args[@]}" 2>&1; echo "[hpac release] build.sh exit $?")
build_rc=$(sed -n 's/^\[hpac release\] build.sh exit //p' "$build_log" | tail -1)
if [ "$build_rc" != 0 ]; then
  [ -n "$building_at" ] || configure_s=""
  fail "tools/build.sh (exit $build_rc)" "$build_log"
fi
build_s=$(( $(date +%s) - building_at ))
step "configured in $configure_s s (set-up check included), built in $build_s s"

# --- 3. CTest ------------------------------------------------------------------------------------------------------
step "CTest in $(basename "$build") (no multi-rank entries)"
ctest_rc=0
(cd "$build" && ctest --output-on-failure -j "$jobs" -E '^dist\.' >"$build/ctest.log" 2>&1) || ctest_rc=$?
grep -E 'tests passed|tests failed|Total Test time|^\s+[0-9]+ - ' "$build/ctest.log" || true
read -r ctest_passed ctest_total < <(python3 - "$build/ctest.log" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
print(f"{int(m.group(3)) - int(m.group(2))} {m.group(3)}" if m else "0 0")
EOF
)
ctest_failed=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (\(Failed\|Timeout\|SEGFAULT\|Subprocess aborted\|Child aborted\|Exception\|Not Run\).*/\1/p' \
  "$build/ctest.log" | tr -d ' ' | paste -sd ';' -)
# The Python tests' counts: the pytest summaries in CTest's full log (every pytest entry, summed).
read -r pytest_passed pytest_failed pytest_skipped < <(python3 - "$build/Testing/Temporary/LastTest.log" <<'EOF'
import re, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
try:
    text = open(sys.argv[1], errors="replace").read()
except OSError:
    text = ""
for line in text.splitlines():
    line = line.strip().strip("=").strip()
    if re.match(r"^\d+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)\b.* in [\d.]+s", line):
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", line):
            counts["failed" if what.startswith("error") else what] += int(n)
print(counts["passed"], counts["failed"], counts["skipped"])
EOF
)
step "CTest: $ctest_passed of $ctest_total passed; pytest: $pytest_passed passed, $pytest_failed failed, $pytest_skipped skipped"
[ "$ctest_total" -gt 0 ] || fail "CTest ran no tests" "$build/ctest.log"
# A failing CTest entry does not stop the run: the pip path below is checked too, and the run fails at the end.
ctest_failure=""
if [ "$ctest_rc" != 0 ]; then
  ctest_failure="CTest: failed ${ctest_failed:-(see the log)}"
  echo "[hpac release] $ctest_failure; the failures (full output: $(basename "$build")/ctest.log):" >&2
  grep -E '^(FAILED|ERROR) |^[0-9]+ failed|^\s+[0-9]+ - ' "$build/ctest.log" >&2 || true
fi

# --- 4. the pip path -----------------------------------------------------------------------------------------------
step "pip install --no-build-isolation . into $(basename "$venv") (log: $(basename "$build").pip.log)"
pip_log=$build.pip.log
wheel_args=()
if command -v ccache >/dev/null 2>&1; then
  # As tools/build.sh and tools/package_test.sh: the same generator and ccache, so compiles the build made are reused.
  wheel_args=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
generator=$(sed -n 's/^CMAKE_GENERATOR:[A-Z]*=//p' "$build/CMakeCache.txt")
pip_start=$(date +%s)
pip_ok=0
if env "${pip_env[@]}" CMAKE_GENERATOR="$generator" "$py" -m pip install --disable-pip-version-check --no-build-isolation \
     -C build-dir="$build-wheel" "${wheel_args[@]}" "$root" >"$pip_log" 2>&1; then
  pip_ok=1
fi
pip_s=$(( $(date +%s) - pip_start ))
[ "$pip_ok" = 1 ] || fail "pip install --no-build-isolation ." "$pip_log"
step "installed in $pip_s s; python -m hpac:"
# From the venv's folder with -I: the installed package, not the source tree's.
hpac_out=$(cd "$venv" && "$py" -I -m hpac 2>&1) || { echo "$hpac_out" >"$build.hpac.log"; fail "python -m hpac" "$build.hpac.log"; }
echo "$hpac_out" | sed 's/^/    /'
hpac_info=$(echo "$hpac_out" | head -1 | tr -d '"\\')
step "test/package/wheel_smoke.py against the installed package"
smoke_ok=0
(cd "$venv" && env -u HPAC_LIBRARY "$py" -I "$root/test/package/wheel_smoke.py") >"$build.smoke.log" 2>&1 && smoke_ok=1
sed 's/^/    /' "$build.smoke.log"
[ "$smoke_ok" = 1 ] || fail "test/package/wheel_smoke.py" "$build.smoke.log"
# Leave the venv as CTest found it: the source tree's package, not the installed one.
"$py" -m pip uninstall -q -y hpac >>"$log" 2>&1 || true
step "the self-contained wheel for torch $torch_full: pip wheel, auditwheel repair (tools/packaging/repair_wheel.sh)"
wheel_dir=$build-dist
rm -rf "$wheel_dir"
env "${pip_env[@]}" CMAKE_GENERATOR="$generator" "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation \
  --no-deps -w "$wheel_dir" -C build-dir="$build-wheel" "${wheel_args[@]}" "$root" >>"$pip_log" 2>&1 \
  || fail "pip wheel --no-build-isolation ." "$pip_log"
repaired=$("$root/tools/packaging/repair_wheel.sh" "$py" "$(ls "$wheel_dir"/hpac-*.whl)" "$wheel_dir/repaired" \
  "$build.auditwheel.log") || fail "auditwheel repair" "$build.auditwheel.log"
wheel_tag=$(basename "$repaired" .whl | cut -d- -f3-)
step "wheel $(basename "$repaired") (tag $wheel_tag)"

# --- 5. the result -------------------------------------------------------------------------------------------------
failed_step=$ctest_failure
record
if [ "$remove_after" = 1 ]; then
  step "removing $(basename "$venv") and $(basename "$build") (--remove-after)"
  rm -rf "$venv" "$build" "$build-wheel" "$build-dist"
fi
cat <<EOF
[hpac release] torch $torch_full ($([ -n "$cuda" ] && echo "CUDA $cuda build, on CPU" || echo "CPU build")), Python $python_version: ${ctest_failure:-passed}
  configure ${configure_s} s, build ${build_s} s ($jobs jobs$([ "$with_trainer" = 1 ] && echo ", with the trainer"))
  CTest ${ctest_passed}/${ctest_total} passed; pytest ${pytest_passed} passed, ${pytest_failed} failed, ${pytest_skipped} skipped
  pip install --no-build-isolation . ok (${pip_s} s); python -m hpac: ${hpac_info}; wheel smoke ok
  self-contained wheel: ${wheel_tag}
  total $(( $(date +%s) - start )) s
EOF
[ -z "$ctest_failure" ] || exit 1
