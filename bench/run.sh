#!/usr/bin/env bash
# The fast benchmarks, in one go (bench/README.md lists every benchmark, its JSON and its docs region): builds, then
# runs the per-op overhead benchmark, the per-mode step benchmarks (core blocks; trainer zoo models with AdamW), the
# Python peer harness, hpac beside PyTorch's own SAC, the Python policy_fn benchmark, the multi-rank hpac-train
# comparisons and the main job's budget plans (against the exact optimum, its frontier, its memory target, its plan
# made on the meta device), writing JSON to bench/results/, the plots to docs/, and the docs' generated regions from
# the new JSON (with HPAC_BENCH_OUT=DIR the JSON goes to DIR instead and the docs are left alone). Its budget: about
# 15 minutes on a 2-core machine (on 2026-12-07 its first nine steps took 6, the last two 2). At the end it names the
# benchmarks it left out (each would take the suite past its budget, or needs what this machine may lack) and the
# command of each.
#
#   bench/run.sh            # everything below
#   bench/run.sh --list     # only the list: what runs here, what is left out
#
# Allocator control: glibc malloc serves large tensors with mmap/munmap, and the page faults then dominate CPU step
# time and penalise the mode with the largest live set (off). The suite raises the mmap and trim thresholds so that
# freed tensor memory is reused, for every mode alike (GLIBC_TUNABLES below; each JSON records it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HPAC_BUILD_DIR:-$root/build}
out=${HPAC_BENCH_OUT:-$root/bench/results}
python=${HPAC_TORCH_PYTHON:-$root/.venv/bin/python}  # the torch build/ was built against

# Left out of this suite: module, the wall time its JSON in bench/results/ recorded on this 2-core machine (wall_s;
# "unrecorded" where the JSON has none), and the command that runs it.
left_out() {
  cat <<'EOF'
bench.budget.budget_frontier      10 min    python -m bench.budget.budget_frontier
bench.budget.memory_target --shapes 30b  7 to 76 min  python -m bench.budget.memory_target --shapes 30b ...
bench.budget.meta_plan (30b shapes, --scale)  4 to 24 min  python -m bench.budget.meta_plan --check --shapes 30b ...
bench.budget.plan_stability       (unrecorded) python -m bench.budget.plan_stability
bench.budget.recompute_floor      (unrecorded) python -m bench.budget.recompute_floor
bench.budget.cost_estimate        (unrecorded) python -m bench.budget.cost_estimate
bench.peers.torchtitan_sac        (unrecorded) python -m bench.peers.torchtitan_sac   (torchtitan)
bench.peers.compile_compare       4 min     python -m bench.peers.compile_compare     (torch >= 2.4, a C++ compiler)
bench.scale.target_shapes         40 min    python -m bench.scale.target_shapes
bench.scale.frontier_30b          18 min    python -m bench.scale.frontier_30b
bench.scale.hf_qwen3_30b_layer    (unrecorded) python -m bench.scale.hf_qwen3_30b_layer
bench.scale.gpu_check             a device  tools/gpu_check.sh                        (a CUDA device)
bench.distributed.dist_torchrun   (unrecorded) python -m bench.distributed.dist_torchrun (--drift: 1 min)
bench.soak.soak                   20 min    python -m bench.soak.soak
EOF
}

if [ "${1:-}" = "--list" ]; then
  echo "runs here: bench/cpp (hpac_bench_overhead, hpac_bench_step, hpac_bench_train_step), bench.peers.peer_harness,"
  echo "  bench.peers.sac_peer, bench.peers.policy_fn_overhead, bench.distributed.hpac_train_compare,"
  echo "  bench.budget.plan_oracle, bench.budget.main_job_frontier, bench.budget.memory_target,"
  echo "  bench.budget.meta_plan --check (the main job)"
  echo "left out (time on a 2-core machine, command):"
  left_out | sed 's/^/  /'
  exit 0
fi
[ $# -eq 0 ] || { echo "bench/run.sh: unknown argument '$1'; allowed: none, or --list" >&2; exit 2; }

"$root/tools/build.sh"
mkdir -p "$out"
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296
export HPAC_LIBRARY="$build/plugin/libhpac.so" HPAC_CONFIG_LIBRARY="$build/tools/trainer/libhpac_config.so"
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo unknown)
echo "[hpac bench] BLAS: $blas; GLIBC_TUNABLES=$GLIBC_TUNABLES; $(nproc) CPUs"
echo "$blas" >"$out/blas.txt"

# A benchmark module of this package, run from the checkout's root with this checkout's hpac.
bench() {
  (cd "$root" && PYTHONPATH="$root/plugin/python:$root${PYTHONPATH:+:$PYTHONPATH}" "$python" -m "$@")
}

echo "[hpac bench] 1/11 per-op overhead"
"$build/bench/hpac_bench_overhead" --benchmark_repetitions=7 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/overhead.json" --benchmark_out_format=json

echo "[hpac bench] 2/11 block step per mode (off / full / selective side by side)"
"$build/bench/hpac_bench_step" --benchmark_out="$out/step.json" --benchmark_out_format=json \
  ${HPAC_BENCH_FILTER:+--benchmark_filter=$HPAC_BENCH_FILTER}

echo "[hpac bench] 3/11 trainer step per mode on the zoo models (Qwen3-MoE tiny, GPT-2-like)"
"$build/bench/hpac_bench_train_step" --benchmark_out="$out/train_step.json" --benchmark_out_format=json \
  ${HPAC_BENCH_FILTER:+--benchmark_filter=$HPAC_BENCH_FILTER}

echo "[hpac bench] 4/11 Python peer harness (off, torch checkpoint, Python-mode SAC, hpac)"
bench bench.peers.peer_harness --out "$out/peer.json"

echo "[hpac bench] 5/11 hpac vs PyTorch's own SAC (same policy), eager and SDPA attention, and per-op cost"
bench bench.peers.sac_peer --out "$out/sac_peer.json"

echo "[hpac bench] 6/11 a Python policy_fn per op, forward and recompute: hpac vs PyTorch's own SAC, and hpac's C++ rules"
bench bench.peers.policy_fn_overhead --out "$out/policy_fn_overhead.json"

echo "[hpac bench] 7/11 multi-rank comparisons of docs/distributed.md (hpac-train --compare --nproc N)"
bench bench.distributed.hpac_train_compare --build "$build" --out "$out/distributed.json"

echo "[hpac bench] 8/11 hpac's budget plans beside the exact optimum (MILP) on the main job"
bench bench.budget.plan_oracle --out "$out/plan_oracle.json"

echo "[hpac bench] 9/11 the budget's frontier on the main job, off / full / selective / budgets / the optimum"
bench bench.budget.main_job_frontier --out "$out/main_job_frontier.json"

echo "[hpac bench] 10/11 the whole-step memory target on the main job, targets between full's and off's peaks"
bench bench.budget.memory_target --out "$out/memory_target.json"

echo "[hpac bench] 11/11 the main job planned on the meta device, each plan applied by a real run"
bench bench.budget.meta_plan --check --out "$out/meta_plan_main.json"

if [ "$out" -ef "$root/bench/results" ]; then
  bench bench.cpp.step_plot "$out/step.json" "$root/docs/results_step.svg" --layers 4
  bench bench.budget.memory_target --plot "$out/memory_target.json" "$root/docs/results_memory_target.svg"
  # Every generated region and inline figure of the documents from the new JSON.
  bench bench.report --results "$out" --write "$root"/docs/*.md "$root/README.md"
  echo "[hpac bench] results in $out; plot in docs/results_step.svg; docs/*.md and README.md regenerated"
else  # the documents quote bench/results/ only: results elsewhere are for comparing
  echo "[hpac bench] results in $out (HPAC_BENCH_OUT); docs and plot left as they are (they quote bench/results/)"
fi
echo "[hpac bench] left out of this suite (bench/README.md; run each on its own):"
left_out | sed 's/^/  /'
