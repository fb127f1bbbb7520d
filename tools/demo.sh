#!/usr/bin/env bash
# The main job: set up, build, and run the hpac demo (evidence table of off /
# full / selective on a stack of Qwen3-MoE-shaped blocks). Extra arguments go
# to hpac-demo (see hpac-demo --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
exec "${HPAC_BUILD_DIR:-$root/build}/tools/hpac-demo" "$@"
