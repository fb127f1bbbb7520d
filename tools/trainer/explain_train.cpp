#include "tools/trainer/explain_train.h"

#include "tools/trainer/trainer.h"

#include "absl/strings/str_cat.h"

#include <memory>
#include <vector>

namespace hpac::trainer {

absl::StatusOr<ExplainReport> explainTraining(const TrainConfig& config, const ModelRegistry& registry,
                                              CheckpointMode explained) {
  if (explained == CheckpointMode::kOff) {
    return absl::InvalidArgumentError(
        "--explain with mode off: off checkpoints no region, so there is nothing to explain; allowed: full, "
        "selective, budget (--mode or activation_checkpoint.mode)");
  }
  if (config.train.dtype != "float32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--explain measures tensor bytes with the tracking allocator, which cannot serve ", config.train.dtype,
        " matmuls (oneDNN buffers); allowed: train.dtype float32"));
  }
  if (explained == CheckpointMode::kBudget && !config.activation_checkpoint.memory_budget) {
    return absl::InvalidArgumentError("--explain in mode budget needs activation_checkpoint.memory_budget");
  }
  if (config.parallel.distributed()) {
    return absl::InvalidArgumentError("--explain runs one process; allowed: a config without a parallel layout");
  }
  ExplainReport report;
  report.source = absl::StrCat("hpac-train ", config.model.preset, " (", config.model.num_layers, " layers, seq ",
                               config.train.seq_len, " x batch ", config.train.micro_batch,
                               explained == CheckpointMode::kBudget ? ", step 0; budget: step 1, after its profile)"
                                                                    : ", step 0)");
  report.mode = toString(explained);
  std::vector<CheckpointMode> modes = {CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kSelective};
  if (explained == CheckpointMode::kBudget) modes.push_back(CheckpointMode::kBudget);
  for (const CheckpointMode mode : modes) {
    TrainConfig c = config;
    c.activation_checkpoint.mode = mode;
    c.activation_checkpoint.layers.clear();
    auto trainer = Trainer::create(c, registry, [](LogLevel, const std::string&) {});  // quiet: the table is the output
    if (!trainer.ok()) return trainer.status();
    // A budget's first step is its regions' profile; the explained step replays the plan.
    int64_t step = 0;
    if (mode == CheckpointMode::kBudget) (*trainer)->step(step++);
    auto recorder = std::make_shared<DecisionRecorder>();
    auto stats = std::make_shared<InvocationStats>();
    if (mode == explained) {
      CheckpointableLayer* layer = nullptr;
      for (const PreparedLayer& p : (*trainer)->preparation().layers) {
        if (p.layer.checkpointable != nullptr && p.setting.enabled() && !p.setting.reentrant) {
          layer = p.layer.checkpointable;
          report.region = p.layer.path;
          break;
        }
      }
      if (layer == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--explain: no layer of ", config.model.preset, " is checkpointed non-reentrantly in mode ",
            toString(mode), "; nothing to explain (the native reentrant route has no per-op decisions)"));
      }
      layer->explainNextCheckpoint(recorder, stats);
    }
    TimelineCapture capture;
    (*trainer)->markTimeline(&capture);
    (*trainer)->step(step);
    (*trainer)->markTimeline(nullptr);
    report.timelines.push_back(capture.finish(toString(mode)));
    if (mode == explained) {
      report.ops = recorder->ops();
      report.stats = *stats;
    }
  }
  return report;
}

}  // namespace hpac::trainer
