#!/usr/bin/env bash
# hpac set-up: installs what hpac needs, only what is missing. Idempotent: a
# second run does nothing but check.
#  1. Debian packages (as root, or with sudo): the toolchain (with ccache: tools/build.sh
#     uses it, and the packaging stage's wheel build then reuses build/'s compiles), abseil, yaml-cpp,
#     GoogleTest, Google Benchmark, OpenBLAS, Debian's torch 1.13.1 (libtorch-dev, python3-torch),
#     the compatibility leg, and clang-14 with libFuzzer (tools/fuzz.sh).
#  2. The virtual environment .venv (ignored by git) with the pinned packages of
#     tools/requirements.txt: torch 2.13.0, the default torch of every build; then, with --no-deps,
#     tools/requirements-nodeps.txt (torchtitan for hpac.torchtitan's test and bench/peers/torchtitan_sac.py);
#     and a .pth file that puts this checkout's plugin/python on the venv's path.
#
# Usage: tools/setup.sh
# Environment: HPAC_VENV (default <repo>/.venv), HPAC_VENV_PYTHON (the Python
# 3.11 that creates it; default python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  cmake g++ make ccache
  libtorch-dev
  libabsl-dev
  libyaml-cpp-dev
  libgloo-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libopenblas0-pthread
  python3-torch python3-pytest python3-venv
  clang-14 libfuzzer-14-dev libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[hpac setup] all ${#packages[@]} Debian packages present"
else
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo_cmd=(sudo)
    else
      echo "[hpac setup] missing packages: ${missing[*]}" >&2
      echo "[hpac setup] run this script as root (or install sudo) so it can apt-get them" >&2
      exit 1
    fi
  fi
  echo "[hpac setup] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh root has no package lists yet; refresh them when they are absent or older than a day.
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    "${sudo_cmd[@]}" apt-get update -q
  fi
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

venv=${HPAC_VENV:-$root/.venv}
requirements=$root/tools/requirements.txt
nodeps=$root/tools/requirements-nodeps.txt  # installed with --no-deps (see the file)
stamp=$venv/.hpac-requirements
# The checkout's hpac on the venv's path (a .pth file, as `pip install -e` would leave): `.venv/bin/python -m hpac`,
# `-m bench.<area>.<name>` and the examples import this checkout's plugin/python without a PYTHONPATH.
source_path() {
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [ "$(cat "$site/hpac-source.pth" 2>/dev/null)" = "$root/plugin/python" ] || echo "$root/plugin/python" >"$site/hpac-source.pth"
}
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cat "$requirements" "$nodeps" | cmp -s - "$stamp"; then
  source_path
  echo "[hpac setup] $(basename "$venv") up to date ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  py=${HPAC_VENV_PYTHON:-python3}
  echo "[hpac setup] creating $(basename "$venv") with $("$py" --version 2>&1)"
  "$py" -m venv "$venv"
fi
# pip first, at the pinned release: a venv made by Debian's python3 starts with Debian's pip 23.0.1, whose
# `pip wheel` lacks -C/--config-settings (pip >= 23.1), which the packaging stage passes to scikit-build-core.
pip_pin=$(grep -E '^pip==' "$requirements")
echo "[hpac setup] installing $pip_pin, then tools/requirements.txt into $(basename "$venv")"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$pip_pin"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$nodeps"
source_path
cat "$requirements" "$nodeps" >"$stamp"
echo "[hpac setup] $(basename "$venv"): $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
