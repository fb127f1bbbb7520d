#!/usr/bin/env bash
# The accelerator check (issue 37, item 4), as one command, inside 10 minutes on one machine with one NVIDIA GPU and
# a CUDA build of pip torch, transformers, cmake and g++:
#
#   tools/gpu_check.sh [OUT_DIR]             (default: gpu-check/ in the checkout)
#   tools/gpu_check.sh --dry-run [OUT_DIR]   the same code on device cpu with tiny shapes, no build, seconds: the
#                                            CTest entry python.gpu_check_dry_run (README's test command) runs it
#
# 1. Builds libhpac and the config library against that Python's torch into build-gpu/, as tools/gpu_level1.sh does
#    (abseil and yaml-cpp: the system's, or Debian 12's packages unpacked from HPAC_DEB_DIR, default .debs/).
#    --dry-run builds nothing: HPAC_LIBRARY and HPAC_CONFIG_LIBRARY, else build/'s.
# 2. bench/scale/gpu_check.py on cuda in bfloat16 (--dry-run: cpu, float32, tiny): five sections, each recorded in
#    OUT_DIR/gpu_check.json whether it passed or raised:
#      core           hpac.checkpoint full / selective / budget and a policy_fn through
#                     hpac.create_selective_checkpoint_contexts, bit for bit against no checkpoint with dropout (the
#                     CUDA RNG replayed), again on a non-default CUDA stream; peak and kept bytes per mode from
#                     torch.cuda.max_memory_allocated
#      target_shapes  bench/scale/target_shapes.py's table at seq 1024 on 1, 2 and 4 layers of Qwen3-30B-A3B's shapes
#                     (8 experts): off / full / selective / budget 0.25 / 0.5 / torch.compile's
#                     activation_memory_budget 0.5, interleaved, with the 48-layer derivation
#                     (OUT_DIR/target_shapes.json and target_shapes.md)
#      sac_peer       PyTorch's SAC and hpac with the same policy_fn on two such layers: kept bytes, time, grads
#      planner        hpac.budget with cost="measured" (device-timed profile) and cost="estimated" (roofline)
#      memory_target  hpac.fit_memory_target on two such layers: off's and full's step peaks from the caching
#                     allocator, then targets between: predicted and measured peak, every planned step after the
#                     first under its target, loss bit for bit with off
# 3. bench/scale/gpu_check.py --verify: every section there and passed. The last line says so; the exit status is 0 only
#    then.
# HPAC_GPU_PYTHON picks the Python (default python3; --dry-run: .venv/bin/python where it exists).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
out=${1:-$root/gpu-check}
say() { echo "[hpac gpu-check] $*"; }
if [ $dry = 1 ] && [ -z "${HPAC_GPU_PYTHON:-}" ] && [ -x "$root/.venv/bin/python" ]; then
  python=$root/.venv/bin/python
else
  python=${HPAC_GPU_PYTHON:-python3}
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the benchmark runs from the checkout's root
rm -f "$out/gpu_check.json"  # a stale result never passes
export PYTHONPATH=$root/plugin/python:$root PYTHONUNBUFFERED=1  # hpac from this checkout; bench as a package
cd "$root" CUBLAS_WORKSPACE_CONFIG=:4096:8
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$out/inductor-cache}

if ! version=$("$python" -c 'import torch, transformers; print(torch.__version__)' 2>/dev/null); then
  say "$python lacks torch or transformers; set HPAC_GPU_PYTHON to a Python with both"
  exit $([ $dry = 1 ] && echo 77 || echo 2)  # 77: CTest's SKIP_RETURN_CODE (as python.hf skips without transformers)
fi
start=$(date +%s)
if [ $dry = 1 ]; then
  export HPAC_LIBRARY=${HPAC_LIBRARY:-$root/build/plugin/libhpac.so}
  export HPAC_CONFIG_LIBRARY=${HPAC_CONFIG_LIBRARY:-$root/build/tools/trainer/libhpac_config.so}
  say "dry run on cpu: torch $version, $HPAC_LIBRARY"
  timeout 240 "$python" -m bench.scale.gpu_check --dry-run --out "$out"
else
  if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    say "$python's torch $version sees no CUDA device; this script needs one (--dry-run runs on cpu)"
    exit 2
  fi
  say "$("$python" -c 'import torch, transformers as t; print(f"torch {torch.__version__}, transformers" \
                                                             f" {t.__version__}, {torch.cuda.get_device_name(0)}")')"
  . "$root/tools/gpu_build.sh"
  hpac_gpu_build
  # what is left of 10 minutes after the build, at least 5 minutes
  left=$(( 600 - ($(date +%s) - start) ))
  timeout $(( left > 300 ? left : 300 )) "$python" -m bench.scale.gpu_check --out "$out" --device cuda \
    --dtype bfloat16 --layers 1,2,4 --steps 4
fi
status=$?
[ $status = 0 ] || say "bench/scale/gpu_check.py exited with $status"
"$python" -m bench.scale.gpu_check --verify "$out/gpu_check.json"
verified=$?
say "$( [ $verified = 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - start )) s (JSON and tables in $out)"
[ $verified = 0 ] && [ $status = 0 ]
