// Training step per checkpoint mode, side by side: every benchmark iteration
// runs one step in each mode (off, full, selective) in turn on the same model
// and input, so the three share the machine's state of the moment; the
// reported counters are per-mode medians over iterations and their ratios.
//
//   BM_Step/<seq>/<layers>   stack of Qwen3-MoE-shaped blocks (tools/moe/moe_block.h), batch 1, fp32
//
// Counters (per mode m in off, full, selective):
//   m_ms               median step time (forward + backward), milliseconds
//   m_peak_MiB         peak tensor bytes over the step's baseline (tracking CPU allocator)
//   m_kept_MiB         tensor bytes alive after forward (activations kept for backward)
//   m_recomputed       ops whose kernel ran again in the recompute (per step)
//   m_served           ops served from hpac's cache in the recompute (per step)
//   full_vs_off_time, selective_vs_off_time, full_vs_off_peak, selective_vs_off_peak
// Tensor memory does not go through operator new, so Google Benchmark's
// memory manager cannot see it; the tracking allocator is used instead.
#include "replay/tracking_allocator.h"
#include "tools/evidence/evidence.h"
#include "tools/moe/moe_block.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void BM_Step(benchmark::State& state) {
  const int64_t seq = state.range(0);
  const int64_t layers = state.range(1);
  hpac::MoeBlockConfig config;  // hidden 64, 4 heads, 4 experts, top-2
  config.hidden = 128;
  config.heads = 4;
  config.expert_hidden = 192;
  std::vector<hpac::MoeBlock> blocks;
  for (int64_t l = 0; l < layers; ++l) blocks.emplace_back(config, 1000 + static_cast<uint64_t>(l));
  at::manual_seed(0);
  const at::Tensor x = at::randn({1, seq, config.hidden});
  const hpac::CheckpointMode modes[] = {hpac::CheckpointMode::kOff, hpac::CheckpointMode::kFull, hpac::CheckpointMode::kSelective};
  std::map<hpac::CheckpointMode, std::vector<double>> ms;
  std::map<hpac::CheckpointMode, hpac::StepReport> last;
  for (hpac::CheckpointMode m : modes) hpac::runStep(blocks, x, m, 1);  // warm-up
  for (auto _ : state) {
    for (hpac::CheckpointMode m : modes) {
      const auto t0 = std::chrono::steady_clock::now();
      last[m] = hpac::runStep(blocks, x, m, 1);
      ms[m].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  for (hpac::CheckpointMode m : modes) {
    const std::string name = hpac::toString(m);
    const hpac::StepReport& r = last[m];
    state.counters[name + "_ms"] = median(ms[m]);
    state.counters[name + "_peak_MiB"] = static_cast<double>(r.peak_over_baseline) / kMiB;
    state.counters[name + "_kept_MiB"] = static_cast<double>(r.kept_after_forward) / kMiB;
    state.counters[name + "_recomputed"] = static_cast<double>(r.stats.recomputed);
    state.counters[name + "_served"] = static_cast<double>(r.stats.served);
  }
  // Paired ratios: medians of per-iteration ratios.
  for (hpac::CheckpointMode m : {hpac::CheckpointMode::kFull, hpac::CheckpointMode::kSelective}) {
    std::vector<double> ratio;
    for (size_t i = 0; i < ms[m].size(); ++i) ratio.push_back(ms[m][i] / ms[hpac::CheckpointMode::kOff][i]);
    const std::string name = hpac::toString(m);
    state.counters[name + "_vs_off_time"] = median(ratio);
    state.counters[name + "_vs_off_peak"] = static_cast<double>(last[m].peak_over_baseline) /
                                            static_cast<double>(last[hpac::CheckpointMode::kOff].peak_over_baseline);
  }
  state.SetLabel("moe hidden 128, batch 1, fp32");
}

BENCHMARK(BM_Step)
    ->ArgNames({"seq", "layers"})
    ->ArgsProduct({{128, 256, 512, 1024}, {2, 4, 8}})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
