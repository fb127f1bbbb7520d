// hpac/tools/trainer/trainer.h
//
// The training loop behind hpac-train: builds the zoo model from the config's
// seed, prepares it (routing.h), and runs AdamW steps on a deterministic token
// stream, measuring loss, step time, peak tensor bytes (TrackingAllocator) and
// hpac's recompute evidence per step. runCompare() trains off, full and
// selective (and budget when the config has a memory_budget, one rank only)
// from the same seed, interleaved step by step in one process, and
// compares every step's loss and gradients with off.
#pragma once

#include "tools/trainer/config.h"
#include "tools/trainer/parallel.h"
#include "tools/trainer/registry.h"
#include "tools/trainer/routing.h"
#include "tools/trainer/zoo_common.h"
#include "replay/explain.h"

#include "absl/status/statusor.h"

#include <torch/optim/adamw.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace hpac::trainer {

// Token ids [micro_batch, seq_len] for `step`: each row an arithmetic sequence
// modulo the vocabulary with a random start and stride, drawn from a generator
// seeded by (seed, step). Learnable, deterministic, the same for every mode.
at::Tensor tokenBatch(const TrainConfig& config, int64_t step);

// Process-group calls of one step on this rank (parallel runs), by where they
// ran: in a forward region, in a recompute region. `saved` counts the
// collectives the selective policy saves (allreduce, send, recv); `gathers`
// the FSDP all-gathers, which every mode re-issues in the recompute.
struct StepCollectives {
  int64_t saved_forward = 0, saved_recompute = 0;
  int64_t gathers_forward = 0, gathers_recompute = 0;
  int64_t outside = 0;  // everything outside regions: backward, gradient sync
};

struct StepResult {
  int64_t step = 0;
  double loss = 0;
  double seconds = 0;      // forward + backward + optimizer step
  // Peak tensor bytes above the step's start, during forward + backward; -1
  // when memory is not tracked (bfloat16, see Trainer::create).
  int64_t peak_bytes = 0;
  LayerStats stats;        // summed over the step's checkpoint invocations
  std::vector<LayerStats> layer_stats;  // per prepared layer
  std::vector<at::Tensor> grads;        // keep_grads: input-embedding grad, then every parameter's grad
  StepCollectives collectives;          // parallel runs only
};

// activation_checkpoint.memory_target: the Trainer plans it on one rank in float32 (tools/trainer/memory_target.h);
// Unimplemented naming the key's file:line:col and what to give instead with parallel ranks or bfloat16.
absl::Status refuseMemoryTarget(const TrainConfig& config);

class Trainer {
 public:
  // Builds, initialises (seed) and prepares the model; installs the
  // TrackingAllocator. bfloat16 matmuls run through oneDNN, whose buffers come
  // from Allocator::raw_allocate, which the TrackingAllocator cannot serve: a
  // bfloat16 trainer therefore does not track memory (peak_bytes -1), and is
  // refused in a process where the tracker is already installed.
  // With `parallel` (config.parallel.distributed()), the model is split over
  // the job's ranks (parallel.h): each rank trains its micro-batch of the
  // global batch (micro_batch x dp rows) and synchronises gradients after
  // backward.
  static absl::StatusOr<std::unique_ptr<Trainer>> create(const TrainConfig& config, const ModelRegistry& registry,
                                                         const LogFn& log = logToStderr,
                                                         std::shared_ptr<ParallelRuntime> parallel = nullptr);
  StepResult step(int64_t index, bool keep_grads = false);
  // Explain: the next steps mark "backward" and "optimizer" on `timeline` (null: none).
  void markTimeline(TimelineCapture* timeline) { timeline_ = timeline; }

  ZooModel& model() { return *model_; }
  std::shared_ptr<ZooModel> modelPtr() { return model_; }
  torch::optim::AdamW& optimizer() { return *optimizer_; }
  const Preparation& preparation() const { return preparation_; }
  const TrainConfig& config() const { return config_; }
  // activation_checkpoint.memory_target's front-end (its StepTarget: plan, history, report), else null.
  const MemoryTargetFront* memoryTarget() const { return target_.get(); }
  const ParallelRuntime* parallel() const { return parallel_.get(); }

 private:
  Trainer() = default;
  TrainConfig config_;
  std::shared_ptr<ParallelRuntime> parallel_;
  bool track_memory_ = true;
  std::shared_ptr<MemoryTargetFront> target_;  // activation_checkpoint.memory_target, else null
  TimelineCapture* timeline_ = nullptr;
  std::shared_ptr<ZooModel> model_;
  Preparation preparation_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

struct CompareRow {
  CheckpointMode mode = CheckpointMode::kOff;
  std::vector<StepResult> steps;
  int64_t peak_bytes = 0;       // max over steps
  double median_seconds = 0;
  double max_loss_diff = 0;     // vs off, over steps
  double max_grad_diff = 0;     // vs off, over steps (input and parameter gradients)
  std::string worst_grad_at;    // where max_grad_diff was seen (this rank's): step, tensor, index, values
  int64_t layers_wrapped = 0, submodules_wrapped = 0;
  std::string route;            // "-", "selective: whole layers", "full: native", ...
  std::string note;             // budget: what its plans keep (the table's footer); "" otherwise
};

struct CompareResult {
  std::vector<CompareRow> rows;  // off, full, selective
  bool bitwise = false;          // every loss and gradient equal to off bit for bit
  // Parallel runs: rows' max_loss_diff / max_grad_diff are against the 1-rank
  // run (an unsharded model on the whole global batch, trained alongside in
  // every rank's process), maxima over all ranks; `bitwise` compares full and
  // selective with the parallel off run. `failures` lists every broken rule
  // (collective counts, peak memory) on this rank.
  bool parallel = false;
  std::vector<std::string> failures;
};

// Trains off, full and selective (the config's per-layer plan is dropped) for
// config.train.steps steps, printing one progress line per step and mode to
// `out` (rank 0 only, in a parallel run).
absl::StatusOr<CompareResult> runCompare(const TrainConfig& config, const ModelRegistry& registry, std::ostream& out,
                                         const LogFn& log = logToStderr,
                                         std::shared_ptr<ParallelRuntime> parallel = nullptr);
std::string formatCompareTable(const CompareResult& result);
// "step 3/6 [selective] loss 5.43210 step 12.3 ms peak 1.23 MiB recomputed 420 served 36"
std::string formatStepLine(const StepResult& r, int64_t steps, CheckpointMode mode);
// A parallel step's counts, appended to its step line: "  collectives fwd/recompute 4/0  gathers 2/2"
std::string formatCollectives(const StepCollectives& c);
// What this process runs on: BLAS, threads, malloc tunables.
std::string environmentLine();

}  // namespace hpac::trainer
