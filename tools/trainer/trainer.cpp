#include "tools/trainer/trainer.h"

#include "policy/budget_policy.h"
#include "replay/tracking_allocator.h"
#include "tools/evidence/compare.h"
#include "tools/trainer/qwen3_moe.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>

namespace hpac::trainer {
namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string routeOf(const Preparation& p, CheckpointMode mode) {
  if (!p.touched) return "-";
  if (mode == CheckpointMode::kSelective || mode == CheckpointMode::kBudget) {
    return p.kv_sharing ? absl::StrCat(toString(mode), "->submodules (KV sharing)")
                        : absl::StrCat(toString(mode), ": whole layers");
  }
  if (p.full_route) return absl::StrCat("full: ", toString(*p.full_route));
  return "-";
}

}  // namespace

at::Tensor tokenBatch(const TrainConfig& config, int64_t step) {
  const int64_t b = config.train.micro_batch, s = config.train.seq_len, v = config.model.vocab_size;
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(config.train.seed) * 7919u +
                                                     static_cast<uint64_t>(step) + 1);
  const at::Tensor start = at::randint(v, {b, 1}, gen, at::kLong);
  const at::Tensor stride = at::randint(1, std::max<int64_t>(2, std::min<int64_t>(v, 8)), {b, 1}, gen, at::kLong);
  return (start + stride * at::arange(s, at::kLong).unsqueeze(0)).remainder(v);
}

absl::Status refuseMemoryTarget(const TrainConfig& config) {
  if (const auto& plan = config.activation_checkpoint.plan) {
    return absl::UnimplementedError(absl::StrCat(
        config.activation_checkpoint.plan_where, ": activation_checkpoint.plan '", *plan, "': a step plan from "
        "`python -m hpac plan` is for the transformers model hpac.hf.prepare wraps; hpac-train trains its own "
        "libtorch model; allowed here: memory_target or memory_budget"));
  }
  const auto& t = config.activation_checkpoint.memory_target;
  if (!t) return absl::OkStatus();
  if (config.parallel.distributed()) {
    return absl::UnimplementedError(absl::StrCat(
        t->where, ": activation_checkpoint.memory_target '", t->text, "' with parallel (", config.parallel.where,
        "): hpac-train plans a whole-step target on one rank; several ranks plan together through hpac.hf.prepare "
        "(docs/python.md, \"Fit a step into N bytes\"); allowed here: no parallel section, or memory_budget"));
  }
  if (config.train.dtype == "bfloat16") {
    return absl::UnimplementedError(absl::StrCat(
        t->where, ": activation_checkpoint.memory_target '", t->text, "' with train.dtype: bfloat16: the target reads "
        "hpac's tracking allocator, which bfloat16 runs without; allowed: train.dtype: float32"));
  }
  return absl::OkStatus();
}

namespace {

// activation_checkpoint.memory_target: every budget layer planned together (tools/trainer/memory_target.h).
std::shared_ptr<MemoryTargetFront> makeTarget(const TrainConfig& config, Preparation& prep, ZooModel& model,
                                              const LogFn& log) {
  const auto& t = config.activation_checkpoint.memory_target;
  std::vector<std::string> names;
  std::vector<std::shared_ptr<BudgetRegion>> regions;
  for (const PreparedLayer& p : prep.layers) {
    if (!p.setting.budget) continue;
    names.push_back(p.layer.path);
    regions.push_back(p.setting.budget);
  }
  if (!t || regions.empty()) return nullptr;
  int64_t params = 0, grads = 0;
  for (const at::Tensor& p : model.parameters()) {
    params += static_cast<int64_t>(p.nbytes());
    if (p.requires_grad()) grads += static_cast<int64_t>(p.nbytes());
  }
  auto front = std::make_shared<MemoryTargetFront>(
      std::make_unique<StepTarget>(t->bytes, names, regions, params, grads),
      [log](bool warning, const std::string& message) {
        if (log) log(warning ? LogLevel::kWarning : LogLevel::kInfo, message);
      });
  int64_t index = 0;
  for (PreparedLayer& p : prep.layers) {
    if (!p.setting.budget) continue;
    p.setting.target = front;
    p.setting.target_index = index++;
    p.layer.checkpointable->setCheckpoint(p.setting);
  }
  if (log) {
    log(LogLevel::kInfo, absl::StrCat("memory target ", t->text, ": step 1 profiles every layer (all recomputed), the "
                                      "plan for the whole step is made at step 2's start"));
  }
  return front;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& config, const ModelRegistry& registry,
                                                         const LogFn& log, std::shared_ptr<ParallelRuntime> parallel) {
  if (auto s = refuseMemoryTarget(config); !s.ok()) return s;
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->parallel_ = std::move(parallel);
  if (config.train.dtype == "bfloat16") {
    if (dynamic_cast<TrackingAllocator*>(c10::GetCPUAllocator()) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          config.file, ": train.dtype: bfloat16 cannot run in a process whose CPU allocator is hpac's "
          "TrackingAllocator (oneDNN's bfloat16 kernels call Allocator::raw_allocate, which it does not support); "
          "use train.dtype: float32, or a separate process"));
    }
    t->track_memory_ = false;
  } else {
    TrackingAllocator::install();
  }
  try {
    t->model_ = makeZooModel(config.model, static_cast<uint64_t>(config.train.seed));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
  if (config.train.dtype == "bfloat16") t->model_->to(at::kBFloat16);
  if (t->parallel_) {
    auto* qwen = dynamic_cast<Qwen3MoeForCausalLM*>(t->model_.get());
    if (qwen == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(config.file, ": parallel: model.preset '", config.model.preset,
                                                     "' is not a Qwen3-MoE model"));
    }
    shardQwen3Moe(*qwen, t->parallel_);
  }
  t->model_->train();
  auto prep = prepareModel(*t->model_, config, registry, log);
  if (!prep.ok()) return prep.status();
  t->preparation_ = *std::move(prep);
  try {
    t->target_ = makeTarget(config, t->preparation_, *t->model_, log);
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(e.what_without_backtrace());
  }
  // Gradients allocated once up front, so every step (and every mode) starts
  // from the same resident set and peak bytes measure the step's own tensors.
  for (at::Tensor& p : t->model_->parameters()) p.mutable_grad() = at::zeros_like(p);
  t->optimizer_ = std::make_unique<torch::optim::AdamW>(
      t->model_->parameters(),
      torch::optim::AdamWOptions(config.train.lr).weight_decay(config.train.weight_decay));
  return t;
}

StepResult Trainer::step(int64_t index, bool keep_grads) {
  TrackingAllocator* tracker = track_memory_ ? &TrackingAllocator::install() : nullptr;
  StepResult r;
  r.step = index;
  at::Tensor tokens;
  if (parallel_) {
    // This rank's rows of the global batch (micro_batch x dp rows).
    TrainConfig global = config_;
    global.train.micro_batch *= config_.parallel.dp;
    const int64_t rows = config_.train.micro_batch;
    tokens = tokenBatch(global, index).narrow(0, parallel_->dp_rank * rows, rows);
    parallel_->counts.reset();
  } else {
    tokens = tokenBatch(config_, index);
  }
  for (at::Tensor& p : model_->parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  at::manual_seed(static_cast<uint64_t>(config_.train.seed) + static_cast<uint64_t>(index));
  if (target_) target_->stepBegin();  // may throw the floor's error: nothing of the step has run
  const auto start = std::chrono::steady_clock::now();
  const int64_t before = tracker ? tracker->currentBytes() : 0;
  if (tracker) tracker->resetPeak();
  {
    at::Tensor loss = model_->loss(tokens);
    r.loss = loss.item<double>();
    if (timeline_ != nullptr) timeline_->mark("backward");
    loss.backward();
  }
  if (parallel_) synchronizeGradients(static_cast<Qwen3MoeForCausalLM&>(*model_), *parallel_);
  r.peak_bytes = tracker ? tracker->peakBytes() - before : -1;
  if (keep_grads) {
    const at::Tensor& embeds = model_->lastInputEmbeds();
    r.grads.push_back(embeds.defined() && embeds.grad().defined() ? embeds.grad().clone() : at::Tensor());
    for (const at::Tensor& p : model_->parameters()) {
      r.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
  }
  if (timeline_ != nullptr) timeline_->mark("optimizer");
  if (target_) target_->optimizerBegins();
  optimizer_->step();
  if (target_) target_->stepDone();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (parallel_) {
    const dist::CollectiveCounts& c = parallel_->counts;
    r.collectives.saved_forward = c.allreduce.forward + c.send.forward + c.recv.forward;
    r.collectives.saved_recompute = c.allreduce.recompute + c.send.recompute + c.recv.recompute;
    r.collectives.gathers_forward = c.allgather.forward;
    r.collectives.gathers_recompute = c.allgather.recompute;
    r.collectives.outside = c.allreduce.other + c.send.other + c.recv.other + c.allgather.other;
  }
  r.layer_stats = takeLayerStats(preparation_);
  for (const LayerStats& s : r.layer_stats) {
    r.stats.invocations += s.invocations;
    r.stats.totals += s.totals;
  }
  return r;
}

std::string formatCollectives(const StepCollectives& c) {
  return absl::StrFormat("  collectives fwd/recompute %d/%d  gathers %d/%d", c.saved_forward, c.saved_recompute,
                         c.gathers_forward, c.gathers_recompute);
}

std::string formatStepLine(const StepResult& r, int64_t steps, CheckpointMode mode) {
  const std::string peak = r.peak_bytes < 0 ? "n/a (untracked)" : absl::StrFormat("%8.3f MiB", mib(r.peak_bytes));
  return absl::StrFormat("step %d/%d [%-9s] loss %.6f  step %7.1f ms  peak %s  recomputed %6d  served %5d",
                         r.step + 1, steps, toString(mode), r.loss, r.seconds * 1e3, peak,
                         r.stats.totals.recomputed, r.stats.totals.served);
}

std::string environmentLine() {
  std::string blas = "unknown";
  std::error_code ec;
  const auto target =
      std::filesystem::canonical("/usr/lib/x86_64-linux-gnu/libblas.so.3", ec);
  if (!ec) blas = target.string().find("openblas") != std::string::npos ? "OpenBLAS" : target.filename().string();
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return absl::StrCat("BLAS ", blas, " (", target.string(), "), ", at::get_num_threads(), " threads, malloc ",
                      tunables != nullptr ? absl::StrCat("GLIBC_TUNABLES=", tunables) : "glibc defaults");
}

namespace {

// A parallel trainer's gradients against the 1-rank reference's: every
// parameter against the slice of the reference gradient it holds
// (shardRule), the input embeddings against the rank's rows of the batch
// (scaled: a rank's loss is the mean over its 1/dp of the batch).
TensorDiff parallelGradDiff(Trainer& t, const StepResult& r, Trainer& ref, const StepResult& rr) {
  const ParallelRuntime& rt = *t.parallel();
  std::map<std::string, size_t> ref_index;
  size_t i = 0;
  for (const auto& item : ref.model().named_parameters()) ref_index[item.key()] = 1 + i++;
  std::vector<at::Tensor> got, want;
  std::vector<std::string> names;
  const int64_t rows = t.config().train.micro_batch;
  if (r.grads[0].defined() || rr.grads[0].defined()) {
    got.push_back(r.grads[0].defined() ? r.grads[0] / static_cast<double>(rt.spec.dp) : at::Tensor());
    want.push_back(rr.grads[0].defined() ? rr.grads[0].narrow(0, rt.dp_rank * rows, rows) : at::Tensor());
    names.push_back("input embeddings");
  }
  i = 0;
  for (const auto& item : t.model().named_parameters()) {
    const ShardRule rule = shardRule(item.key(), rt);
    got.push_back(r.grads.at(1 + i++));
    want.push_back(rule.slice(rr.grads.at(ref_index.at(rule.full_name))));
    names.push_back(item.key());
  }
  return compareTensors(got, want, names);
}

// The composition rules, per step and rank: no collective in a region under
// off; full re-issues every collective in the recompute; selective serves the
// saved ones (re-issues none) and re-gathers the FSDP shards.
void checkCollectives(const StepResult& r, CheckpointMode mode, const ParallelSpec& p, std::vector<std::string>& failures) {
  const StepCollectives& c = r.collectives;
  const std::string where = absl::StrCat("step ", r.step + 1, " [", toString(mode), "]: ");
  const bool has_saved = p.tp > 1 || p.ep > 1;
  if (mode == CheckpointMode::kOff) {
    if (c.saved_forward + c.saved_recompute + c.gathers_forward + c.gathers_recompute != 0) {
      failures.push_back(where + "collectives inside checkpoint regions with checkpointing off");
    }
    return;
  }
  if (has_saved && c.saved_forward == 0) failures.push_back(where + "no collective ran inside a forward region");
  const int64_t want_saved = mode == CheckpointMode::kFull ? c.saved_forward : 0;
  if (c.saved_recompute != want_saved) {
    failures.push_back(absl::StrCat(where, c.saved_recompute, " allreduce/send/recv calls in recompute regions, expected ",
                                    want_saved));
  }
  if (c.gathers_recompute != c.gathers_forward || (p.fsdp && c.gathers_forward == 0)) {
    failures.push_back(absl::StrCat(where, "FSDP all-gathers forward ", c.gathers_forward, ", recompute ",
                                    c.gathers_recompute, "; expected equal and, with fsdp, non-zero"));
  }
}

// The trainers of one comparison: one per mode (off first) and, in a parallel
// run, the 1-rank reference; `worst` turns a rank's figure into the maximum
// over the ranks.
struct Comparison {
  Comparison(const TrainConfig& c, std::shared_ptr<ParallelRuntime> p) : config(c), parallel(std::move(p)) {}
  const TrainConfig& config;
  std::shared_ptr<ParallelRuntime> parallel;
  std::vector<CheckpointMode> modes;
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::unique_ptr<Trainer> reference;
  std::vector<std::string> grad_names;  // "input embeddings", then the parameters'

  double worst(double v) const { return parallel ? allReduceScalar(v, parallel->world_pg, /*max=*/true) : v; }
};

// One trainer per mode (the config's per-layer plan dropped) and its row in
// `result`; budget joins when the config has a memory_budget (one rank only).
absl::Status prepareModeTrainers(Comparison& c, const ModelRegistry& registry, const LogFn& log, CompareResult& result) {
  c.modes = {CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kSelective};
  if (c.config.activation_checkpoint.memory_budget && !c.parallel) c.modes.push_back(CheckpointMode::kBudget);
  for (CheckpointMode mode : c.modes) {
    TrainConfig config = c.config;
    config.activation_checkpoint.mode = mode;
    config.activation_checkpoint.layers.clear();
    if (log) log(LogLevel::kInfo, absl::StrCat("preparing the ", toString(mode), " model"));
    auto t = Trainer::create(config, registry, log, c.parallel);
    if (!t.ok()) return t.status();
    CompareRow row;
    row.mode = mode;
    row.layers_wrapped = (*t)->preparation().layers_wrapped;
    row.submodules_wrapped = (*t)->preparation().submodules_wrapped;
    row.route = routeOf((*t)->preparation(), mode);
    result.rows.push_back(row);
    c.trainers.push_back(*std::move(t));
  }
  return absl::OkStatus();
}

// The 1-rank run: the unsharded model on the whole global batch.
absl::StatusOr<std::unique_ptr<Trainer>> prepareReference(const TrainConfig& config, const ModelRegistry& registry,
                                                         const LogFn& log) {
  TrainConfig c = config;
  c.parallel = ParallelSpec{};
  c.train.micro_batch *= config.parallel.dp;
  c.activation_checkpoint = ActivationCheckpointSpec{};
  if (log) log(LogLevel::kInfo, "preparing the 1-rank reference model");
  return Trainer::create(c, registry, log);
}

// Mode m's step s against off (bit for bit expected) and, in a parallel run,
// against the 1-rank run `ref_now` (the row's differences) and the
// composition rules.
void compareMode(const Comparison& c, int m, int64_t s, std::vector<StepResult>& now, const StepResult& ref_now,
                 CompareResult& result) {
  CompareRow& row = result.rows[m];
  // Against off (the parallel off run, when parallel): bit for bit expected.
  const double dl = c.worst(scalarDiff(now[m].loss, now[0].loss));
  const TensorDiff local = compareTensors(now[m].grads, now[0].grads, c.grad_names);
  const double dg = c.worst(local.max_abs);
  if (dl != 0 || dg != 0) result.bitwise = false;
  // v: the maximum over ranks; d: this rank's comparison (its `where` is empty if this rank matched).
  auto note = [&](double v, const TensorDiff& d) {
    if (v > row.max_grad_diff && !d.where.empty()) row.worst_grad_at = absl::StrCat("step ", s + 1, ": ", d.where);
    row.max_grad_diff = std::max(row.max_grad_diff, v);
  };
  if (c.parallel) {
    const double global_loss =
        allReduceScalar(now[m].loss, c.parallel->dp_pg) / static_cast<double>(c.config.parallel.dp);
    row.max_loss_diff = std::max(row.max_loss_diff, c.worst(scalarDiff(global_loss, ref_now.loss)));
    const TensorDiff vs_ref = parallelGradDiff(*c.trainers[m], now[m], *c.reference, ref_now);
    note(c.worst(vs_ref.max_abs), vs_ref);
    checkCollectives(now[m], c.modes[m], c.config.parallel, result.failures);
  } else {
    row.max_loss_diff = std::max(row.max_loss_diff, dl);
    note(dg, local);
  }
}

// Step s of every mode, the order rotated each step so that no mode always
// runs first (caches, allocator state), and of the reference; one progress
// line per mode (rank 0 only).
void compareStep(const Comparison& c, int64_t s, std::ostream& out, CompareResult& result) {
  const int n = static_cast<int>(c.modes.size());
  std::vector<StepResult> now(n);
  for (int k = 0; k < n; ++k) {
    const int m = static_cast<int>((s + k) % n);
    now[m] = c.trainers[m]->step(s, /*keep_grads=*/true);
  }
  StepResult ref_now;
  if (c.reference) ref_now = c.reference->step(s, /*keep_grads=*/true);
  const bool quiet = c.parallel && c.parallel->rank != 0;
  for (int m = 0; m < n; ++m) {
    compareMode(c, m, s, now, ref_now, result);
    if (!quiet) {
      out << formatStepLine(now[m], c.config.train.steps, c.modes[m])
          << (c.parallel ? formatCollectives(now[m].collectives) : "") << "\n";
    }
  }
  for (int m = 0; m < n; ++m) {
    now[m].grads.clear();
    result.rows[m].steps.push_back(std::move(now[m]));
  }
}

// What the budget layers' plans keep, summed over the layers (the table's footer; Python's hpac.harness.compare writes
// the same sentence from hpac.Budget.status()).
std::string budgetNote(const Trainer& trainer, const TrainConfig& config) {
  int64_t kept = 0, off = 0, saved = 0, skipped = 0, ops = 0, layers = 0;
  double saved_micros = 0, total_micros = 0;
  for (const PreparedLayer& layer : trainer.preparation().layers) {
    if (layer.setting.budget == nullptr) continue;
    const BudgetRegion::Status status = layer.setting.budget->status();
    if (status.stage != BudgetRegion::Stage::kPlanned) continue;
    const BudgetPlan& plan = status.plan;
    ++layers;
    kept += plan.kept_bytes;
    off += std::max<int64_t>(plan.off_bytes, 0);
    saved += std::count(plan.save.begin(), plan.save.end(), true);
    skipped += std::count(plan.skip.begin(), plan.skip.end(), true);
    ops += static_cast<int64_t>(plan.save.size());
    saved_micros += plan.saved_micros + plan.skipped_micros;
    total_micros += plan.total_micros;
  }
  if (layers == 0) return "budget: no layer planned (every step profiled or fell back)";
  return absl::StrFormat("budget (memory_budget %s per layer): %d layer plans keep %.2f MiB of the %.2f MiB off keeps "
                         "(%.0f%%); %d of %d ops saved, %d skipped; %.0f%% of the recompute's profiled kernel time "
                         "avoided",
                         config.activation_checkpoint.memory_budget->text, layers, mib(kept), mib(off),
                         off > 0 ? 100.0 * kept / off : 0.0, saved, ops, skipped,
                         total_micros > 0 ? 100.0 * saved_micros / total_micros : 0.0);
}

// Each row's peak (max over steps) and median step time; in a parallel run, a
// failure for full or selective not below off's peak.
void summariseRows(const Comparison& c, CompareResult& result) {
  for (size_t m = 0; m < result.rows.size(); ++m) {
    CompareRow& row = result.rows[m];
    if (row.mode == CheckpointMode::kBudget) row.note = budgetNote(*c.trainers[m], c.config);
    std::vector<double> seconds;
    row.peak_bytes = row.steps.front().peak_bytes;
    for (const StepResult& r : row.steps) {
      seconds.push_back(r.seconds);
      row.peak_bytes = std::max(row.peak_bytes, r.peak_bytes);
    }
    row.median_seconds = median(seconds);
  }
  if (!c.parallel) return;
  for (int m = 1; m < 3; ++m) {
    if (result.rows[m].peak_bytes >= result.rows[0].peak_bytes) {
      result.failures.push_back(absl::StrCat(toString(c.modes[m]), " peak ", result.rows[m].peak_bytes,
                                             " bytes is not below off's ", result.rows[0].peak_bytes));
    }
  }
}

}  // namespace

absl::StatusOr<CompareResult> runCompare(const TrainConfig& config, const ModelRegistry& registry, std::ostream& out,
                                         const LogFn& log, std::shared_ptr<ParallelRuntime> parallel) {
  Comparison c(config, std::move(parallel));
  CompareResult result;
  result.parallel = c.parallel != nullptr;
  if (absl::Status st = prepareModeTrainers(c, registry, log, result); !st.ok()) return st;
  if (c.parallel) {
    auto reference = prepareReference(config, registry, log);
    if (!reference.ok()) return reference.status();
    c.reference = *std::move(reference);
  }
  c.grad_names = {"input embeddings"};
  for (const auto& item : c.trainers[0]->model().named_parameters()) c.grad_names.push_back(item.key());
  result.bitwise = true;
  for (int64_t s = 0; s < config.train.steps; ++s) compareStep(c, s, out, result);
  summariseRows(c, result);
  return result;
}

// Note [One table for the main job]
// hpac-train --compare and python -m hpac.harness.demo print the same table (hpac.harness.compare.format_table is its
// Python twin): the same columns; peak_vs_off and time_vs_off as signed changes against off (-67.8% is less memory than
// off, +34.3% more time); step_time the median over steps (the mean of the middle two for an even count); the same
// route words; then one footer line per budget row saying what its plans keep.
std::string formatCompareTable(const CompareResult& result) {
  const CompareRow& off = result.rows.front();
  std::string t = absl::StrFormat("%-10s %11s %11s %11s %11s %10s %10s  %-34s %7s %15s %11s\n", "mode", "peak_mem",
                                  "peak_vs_off", "step_time", "time_vs_off", "max|dloss|", "max|dgrad|", "route",
                                  "wrapped", "recomputed/step", "served/step");
  for (const CompareRow& row : result.rows) {
    const StepResult& last = row.steps.back();
    const bool is_off = &row == &off;
    const std::string peak = row.peak_bytes < 0 ? "n/a" : absl::StrFormat("%.2f MiB", mib(row.peak_bytes));
    const std::string peak_change = is_off || off.peak_bytes <= 0 || row.peak_bytes < 0
        ? "-" : absl::StrFormat("%+.1f%%", 100.0 * (static_cast<double>(row.peak_bytes) / off.peak_bytes - 1.0));
    const std::string time_change = is_off || off.median_seconds <= 0
        ? "-" : absl::StrFormat("%+.1f%%", 100.0 * (row.median_seconds / off.median_seconds - 1.0));
    absl::StrAppendFormat(&t, "%-10s %11s %11s %8.1f ms %11s %10.3g %10.3g  %-34s %7s %15d %11d\n",
                          toString(row.mode), peak, peak_change, row.median_seconds * 1e3, time_change,
                          row.max_loss_diff, row.max_grad_diff, row.route,
                          absl::StrCat(row.layers_wrapped, "L+", row.submodules_wrapped, "S"),
                          last.stats.totals.recomputed, last.stats.totals.served);
  }
  for (const CompareRow& row : result.rows) {
    if (!row.note.empty()) absl::StrAppend(&t, row.note, "\n");
  }
  return t;
}

}  // namespace hpac::trainer
