// Per-op cost of hpac's fallback: the same loop of small adds
//   BM_NoRegion          hpac loaded, no region active (the fallback is not reached)
//   BM_RegionForward     inside a region, forward phase, every op recomputed (counted only)
//   BM_RegionForwardSave inside a region, forward phase, every op saved
//   BM_RegionServe       inside a region, recompute phase, every op served from cache
// Counter ns_per_op is the time per add. (The suite with "hpac not loaded" and
// per-mode training steps is bench/'s own issue.)
#include "policy/checkpoint_policy.h"
#include "replay/invocation.h"
#include "replay/region.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

namespace {

constexpr int kOps = 1000;

void addLoop(const at::Tensor& a, const at::Tensor& b) {
  for (int i = 0; i < kOps; ++i) benchmark::DoNotOptimize(at::add(a, b));
}

void report(benchmark::State& state) {
  state.counters["ns_per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kOps,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["ns_per_op"] = state.counters["ns_per_op"] * 1e9;
}

void BM_NoRegion(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) addLoop(a, b);
  report(state);
}

void BM_RegionForward(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) {
    hpac::Invocation inv(hpac::PolicyFactory{});
    hpac::RegionGuard region(inv, hpac::Phase::kForward);
    addLoop(a, b);
  }
  report(state);
}

hpac::PolicyFactory saveAll() {
  return hpac::functionPolicy([](const hpac::OpContext&) { return hpac::CheckpointPolicy::MUST_SAVE; });
}

void BM_RegionForwardSave(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) {
    hpac::Invocation inv(saveAll());
    hpac::RegionGuard region(inv, hpac::Phase::kForward);
    addLoop(a, b);
  }
  report(state);
}

void BM_RegionServe(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) {
    state.PauseTiming();
    auto inv = std::make_unique<hpac::Invocation>(saveAll());
    {
      hpac::RegionGuard region(*inv, hpac::Phase::kForward);
      addLoop(a, b);
    }
    state.ResumeTiming();
    hpac::RegionGuard region(*inv, hpac::Phase::kRecompute);
    addLoop(a, b);
  }
  report(state);
}

BENCHMARK(BM_NoRegion);
BENCHMARK(BM_RegionForward);
BENCHMARK(BM_RegionForwardSave);
BENCHMARK(BM_RegionServe);

}  // namespace

BENCHMARK_MAIN();
