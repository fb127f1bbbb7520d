#!/usr/bin/env bash
# The benchmark suite: builds, then runs the per-op overhead benchmark, the
# per-mode step benchmarks (core blocks; trainer zoo models with AdamW), the
# Python peer harness and the Python policy_fn benchmark, writing JSON to
# bench/results/ and the plot to docs/results_step.svg. A few minutes here.
#
# Allocator control: glibc malloc serves large tensors with mmap/munmap, and
# the page faults then dominate CPU step time and penalise the mode with the
# largest live set (off). The suite raises the mmap and trim thresholds so that
# freed tensor memory is reused, for every mode alike.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
build=${HPAC_BUILD_DIR:-$root/build}
out=$root/bench/results
mkdir -p "$out"
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo unknown)
echo "[hpac bench] BLAS: $blas; GLIBC_TUNABLES=$GLIBC_TUNABLES; $(nproc) CPUs"
echo "$blas" >"$out/blas.txt"

echo "[hpac bench] 1/6 per-op overhead"
"$build/bench/hpac_bench_overhead" --benchmark_repetitions=7 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/overhead.json" --benchmark_out_format=json

echo "[hpac bench] 2/6 block step per mode (off / full / selective side by side)"
"$build/bench/hpac_bench_step" --benchmark_out="$out/step.json" --benchmark_out_format=json \
  ${HPAC_BENCH_FILTER:+--benchmark_filter=$HPAC_BENCH_FILTER}

echo "[hpac bench] 3/6 trainer step per mode on the zoo models (Qwen3-MoE tiny, GPT-2-like)"
"$build/bench/hpac_bench_train_step" --benchmark_out="$out/train_step.json" --benchmark_out_format=json \
  ${HPAC_BENCH_FILTER:+--benchmark_filter=$HPAC_BENCH_FILTER}

echo "[hpac bench] 4/6 Python peer harness (off, torch checkpoint, Python-mode SAC, hpac)"
python=${HPAC_TORCH_PYTHON:-$root/.venv/bin/python}  # the torch build/ was built against
HPAC_LIBRARY="$build/plugin/libhpac.so" PYTHONPATH="$root/plugin/python" \
  "$python" "$root/bench/peer_harness.py" --out "$out/peer.json"

echo "[hpac bench] 5/6 hpac vs PyTorch's own SAC (same policy), eager and SDPA attention, and per-op cost"
HPAC_LIBRARY="$build/plugin/libhpac.so" PYTHONPATH="$root/plugin/python" \
  "$python" "$root/bench/sac_peer.py" --out "$out/sac_peer.json"

echo "[hpac bench] 6/6 a Python policy_fn per op, forward and recompute: hpac vs PyTorch's own SAC, and hpac's C++ rules"
HPAC_LIBRARY="$build/plugin/libhpac.so" PYTHONPATH="$root/plugin/python" \
  "$python" "$root/bench/policy_fn_overhead.py" --out "$out/policy_fn_overhead.json"

echo "[hpac bench] multi-rank comparisons of docs/distributed.md (hpac-train --compare --nproc N)"
"$python" "$root/bench/distributed.py" --build "$build" --out "$out/distributed.json"

"$python" "$root/bench/plot_results.py" "$out/step.json" "$root/docs/results_step.svg" --layers 4
# Every generated region of the documents from the new JSON (tables and the sentences that quote figures).
"$python" "$root/bench/report_results.py" --results "$out" --write "$root"/docs/*.md
echo "[hpac bench] results in $out; plot in docs/results_step.svg; docs/*.md regenerated"
