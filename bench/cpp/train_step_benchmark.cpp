// Trainer step per checkpoint mode, side by side, on the trainer's zoo models:
// three Trainers (off, full, selective) built from the same config and seed,
// stepped in turn inside every benchmark iteration (forward, backward, AdamW),
// so the modes share the machine's state of the moment.
//
//   BM_TrainStep/<model>/seq:<S>/layers:<L>   model 0 = qwen3_moe_tiny, 1 = gpt2_tiny
//
// Counters per mode m: m_ms (median step time), m_peak_MiB (peak tensor bytes
// above the step's start, tracking allocator), m_recomputed / m_served (hpac
// evidence per step); full_vs_off_time, selective_vs_off_time (medians of
// per-iteration ratios), full_vs_off_peak, selective_vs_off_peak.
#include "tools/trainer/trainer.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <sstream>

namespace {

using hpac::CheckpointMode;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void BM_TrainStep(benchmark::State& state) {
  const char* preset = state.range(0) == 0 ? "qwen3_moe_tiny" : "gpt2_tiny";
  std::ostringstream yaml;
  yaml << "model:\n  preset: " << preset << "\n  num_layers: " << state.range(2)
       << "\ntrain:\n  seq_len: " << state.range(1) << "\n  micro_batch: 1\n  steps: 1000\n  seed: 7\n";
  const CheckpointMode modes[] = {CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kSelective};
  std::map<CheckpointMode, std::unique_ptr<hpac::trainer::Trainer>> trainers;
  const auto quiet = [](hpac::trainer::LogLevel, const std::string&) {};
  for (CheckpointMode m : modes) {
    auto config = hpac::trainer::parseConfig(yaml.str() + "activation_checkpoint:\n  mode: " + hpac::toString(m) + "\n",
                                             "bench.yaml");
    if (!config.ok()) {
      state.SkipWithError(std::string(config.status().message()).c_str());
      return;
    }
    auto trainer = hpac::trainer::Trainer::create(*config, hpac::trainer::builtinRegistry().value(), quiet);
    if (!trainer.ok()) {
      state.SkipWithError(std::string(trainer.status().message()).c_str());
      return;
    }
    trainers[m] = std::move(*trainer);
  }
  int64_t step = 0;
  for (CheckpointMode m : modes) trainers[m]->step(step);  // warm-up
  ++step;
  std::map<CheckpointMode, std::vector<double>> ms;
  std::map<CheckpointMode, hpac::trainer::StepResult> last;
  for (auto _ : state) {
    for (CheckpointMode m : modes) {
      last[m] = trainers[m]->step(step);
      ms[m].push_back(last[m].seconds * 1e3);
    }
    ++step;
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  for (CheckpointMode m : modes) {
    const std::string name = hpac::toString(m);
    state.counters[name + "_ms"] = median(ms[m]);
    state.counters[name + "_peak_MiB"] = static_cast<double>(last[m].peak_bytes) / kMiB;
    state.counters[name + "_recomputed"] = static_cast<double>(last[m].stats.totals.recomputed);
    state.counters[name + "_served"] = static_cast<double>(last[m].stats.totals.served);
  }
  for (CheckpointMode m : {CheckpointMode::kFull, CheckpointMode::kSelective}) {
    std::vector<double> ratio;
    for (size_t i = 0; i < ms[m].size(); ++i) ratio.push_back(ms[m][i] / ms[CheckpointMode::kOff][i]);
    const std::string name = hpac::toString(m);
    state.counters[name + "_vs_off_time"] = median(ratio);
    state.counters[name + "_vs_off_peak"] =
        static_cast<double>(last[m].peak_bytes) / static_cast<double>(last[CheckpointMode::kOff].peak_bytes);
  }
  state.SetLabel(std::string(preset) + ", batch 1, fp32, AdamW");
}

BENCHMARK(BM_TrainStep)
    ->ArgNames({"model", "seq", "layers"})
    ->ArgsProduct({{0}, {128, 256, 512, 1024}, {2, 4, 8}})
    ->ArgsProduct({{1}, {128, 512, 1024}, {4}})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
