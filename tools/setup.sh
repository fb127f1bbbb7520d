#!/usr/bin/env bash
# hpac set-up: installs the Debian packages hpac needs, only those that are missing.
# Idempotent: a second run does nothing but check. No download source other than Debian's archive.
#
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  cmake g++ make
  libtorch-dev
  libabsl-dev
  libyaml-cpp-dev
  libgloo-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libopenblas0-pthread
  python3-torch python3-pytest
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[hpac setup] all ${#packages[@]} packages present"
  exit 0
fi

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
echo "[hpac setup] done"
