#!/usr/bin/env bash
# The main job: set up, build, and run hpac-train --compare on the demo config:
# the tiny Qwen3-MoE trained with AdamW under off, full, selective and budget from the
# same seed, interleaved step by step, then the comparison table (peak memory,
# change against off, step time and its change, max |dloss| and |dgrad| against off, recompute
# evidence). Extra arguments go to hpac-train (see hpac-train --help); the core
# evidence table of the checkpoint itself is build/tools/demo/hpac-demo.
# Then the same YAML on the real Hugging Face Qwen3MoeForCausalLM (python -m
# hpac.harness.demo, docs/python.md), where the project's Python has transformers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
# glibc malloc serves large tensors with mmap/munmap and the page faults then
# dominate CPU step time, penalising off for its larger live set
# (../shared/DESIGN.md, "Noise and the allocator"): keep freed memory mapped.
# hpac-train prints the setting it ran with.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296}
build=${HPAC_BUILD_DIR:-$root/build}
"$build/tools/trainer/hpac-train" --config "$root/examples/training_demo/train.yaml" --compare "$@"
python=${HPAC_TORCH_PYTHON:-$root/.venv/bin/python}
if "$python" -c 'import transformers' 2>/dev/null; then
  echo
  echo "== the same config on the real transformers Qwen3MoeForCausalLM (hpac.hf) =="
  HPAC_LIBRARY="$build/plugin/libhpac.so" HPAC_CONFIG_LIBRARY="$build/tools/trainer/libhpac_config.so" \
    PYTHONPATH="$root/plugin/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -m hpac.harness.demo --config "$root/examples/training_demo/train.yaml"
else
  echo "[demo] $python has no transformers: the real-model comparison (python -m hpac.harness.demo) is skipped" >&2
fi
