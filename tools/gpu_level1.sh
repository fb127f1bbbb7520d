#!/usr/bin/env bash
# Level1's checks that need an accelerator, as one command (docs/distributed.md, "Context parallel"), well inside
# 10 minutes on one machine with a CUDA build of pip torch, transformers, cmake and g++:
#
#   tools/gpu_level1.sh [OUT_DIR]        (default: gpu-level1/ in the checkout)
#
# 1. Builds libhpac and the config library (libhpac_config: hpac.hf.load_config) against that Python's torch into
#    build-gpu/. The config library needs abseil and yaml-cpp: the system's, or Debian 12's packages unpacked from
#    HPAC_DEB_DIR (default .debs/ in the checkout; made on a Debian 12 machine with
#    `apt-get download libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7`).
# 2. torch's own context_parallel on cuda, no hpac (test/python/dist/context_parallel_probe.py, 2 ranks).
# 3. hpac.harness.dist_train --device cuda, 3 steps each, every rank against the 1-rank run and full / selective
#    against off:
#    cp2 (torch's context_parallel, ring attention over 2 ranks), tp2, dp2_fsdp, ep2_dp2_fsdp.
# Two ranks run on two GPUs with NCCL, or share one GPU over Gloo when there is one (NCCL refuses two ranks on one
# device). HPAC_GPU_PYTHON picks the Python (default: python3). Each step's output goes to OUT_DIR/<step>.log, each
# run's figures to OUT_DIR/<layout>.json; the last line names the steps that passed and failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/gpu-level1}
python=${HPAC_GPU_PYTHON:-python3}
mkdir -p "$out"
say() { echo "[hpac gpu-level1] $*"; }

if ! version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  say "$python has no torch; set HPAC_GPU_PYTHON to a Python whose torch is built with CUDA"
  exit 2
fi
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  say "$python's torch $version sees no CUDA device; this script needs one (CI and the CPU legs run without it:" \
      "tools/test.sh)"
  exit 2
fi
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
say "$("$python" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}")') x $gpus"

. "$root/tools/gpu_build.sh"
hpac_gpu_build
export PYTHONPATH=$root/plugin/python OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1

passed=() failed=()
port=29700
step() {  # step NAME TIMEOUT_S COMMAND...: runs it, its output in OUT_DIR/NAME.log, the verdict lines echoed
  local name=$1 limit=$2
  shift 2
  port=$((port + 1))
  local verdict=passed
  timeout "$limit" "$@" >"$out/$name.log" 2>&1 || verdict="FAILED (exit $?)"
  if [ "$verdict" = passed ]; then passed+=("$name"); else failed+=("$name"); fi
  grep -E '^\[rank 0\] (OK|FAIL|error)|context_parallel on' "$out/$name.log" | head -4
  say "$name: $verdict"
}
torchrun() { "$python" -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" "$@"; }

step cp_probe 120 torchrun "$root/test/python/dist/context_parallel_probe.py" --device cuda
for layout in cp2 tp2 dp2_fsdp ep2_dp2_fsdp; do
  step "$layout" 150 torchrun -m hpac.harness.dist_train --config "$root/examples/distributed/torchrun/$layout.yaml" \
    --device cuda --steps 3 --json "$out/$layout.json"
done
say "passed: ${passed[*]:-none}; failed: ${failed[*]:-none} (logs and JSON in $out)"
[ ${#failed[@]} -eq 0 ]
