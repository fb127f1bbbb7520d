// hpac-train: trains a model of the zoo under the YAML config's activation
// checkpointing mode, or compares off / full / selective (--compare).
//
//   hpac-train --config examples/training_demo/train.yaml [--mode off|full|selective|budget]
//              [--compare] [--steps N] [--registry PATH] [--nproc N]
//
// With a `parallel:` section (tp x dp ranks), --nproc N starts the N ranks
// itself (hpac-launch's launcher: loopback rendezvous, "[rank r]" prefixed
// output, bounded failure); each rank splits the Qwen3-MoE replica as
// parallel.h describes. --compare then also trains the unsharded model on the
// whole global batch in every rank's process and compares against it.
//
// Exit status: 0 ok; 1 the comparison found full or selective off the
// no-checkpoint run beyond the fp32 tolerance; 2 bad command line, config or
// model preparation.
#include "tools/launch/launcher.h"
#include "tools/trainer/config.h"
#include "tools/trainer/explain_train.h"
#include "tools/trainer/parallel.h"
#include "tools/trainer/registry.h"
#include "tools/trainer/trainer.h"
#include "plugin/version_line.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using namespace hpac::trainer;

const char* kUsage =
    "usage: hpac-train --config FILE [--mode off|full|selective|budget] [--compare] [--steps N] [--registry FILE] "
    "[--nproc N] [--explain [--json FILE] [--svg FILE]] [--version]\n"
    "  --config    trainer YAML (e.g. examples/training_demo/train.yaml)\n"
    "  --mode      override activation_checkpoint.mode (budget needs activation_checkpoint.memory_budget)\n"
    "  --compare   train off, full and selective (and budget when the config has a memory_budget) from the same "
    "seed and print the comparison table\n"
    "  --steps     override train.steps\n"
    "  --registry  model registry YAML (default: the one shipped with hpac)\n"
    "  --nproc     start N local ranks (must equal the config's parallel tp x dp)\n"
    "  --explain   one step per mode: the first layer region's per-op decisions in the config's mode (or --mode)\n"
    "              and the memory timeline; --json / --svg write them (docs/explain.md)\n"
    "  --version   print hpac's version, the libhpac loaded and the torch it was built for";

// Tolerance for a comparison that is not bit for bit (fp32 CPU).
constexpr double kTolerance = 1e-5;

int fail(const std::string& message) {
  std::cerr << "hpac-train: " << message << "\n";
  return 2;
}

int fail(const absl::Status& status) { return fail(std::string(status.message())); }

std::string selfExecutable() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string("hpac-train");
}

std::string describe(const TrainConfig& c) {
  const auto& m = c.model;
  return absl::StrFormat(
      "model %s: %d layers, hidden %d, heads %d/%d kv, head_dim %d, experts %d top-%d (moe_intermediate %d), "
      "vocab %d; seq %d x batch %d, %d steps, AdamW lr %g, seed %d, %s",
      m.preset, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim,
      m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.vocab_size, c.train.seq_len,
      c.train.micro_batch, c.train.steps, c.train.lr, c.train.seed, c.train.dtype);
}

// The command line.
struct Args {
  std::string config_path, registry_path;
  std::optional<std::string> mode;
  std::optional<int64_t> steps;
  std::optional<int> nproc;
  std::vector<std::string> rank_args{selfExecutable()};  // the command line each rank runs (no --nproc)
  bool compare = false, explain = false;
  std::string explain_json, explain_svg;
  bool printed_help = false;  // --help or --version: printed, nothing else to do
};

bool takesValue(const std::string& flag) {
  return flag == "--config" || flag == "--mode" || flag == "--steps" || flag == "--registry";
}

// --config, --mode, --steps or --registry's value, checked.
absl::Status setValue(Args& args, const std::string& flag, const std::string& v) {
  if (flag == "--config") args.config_path = v;
  if (flag == "--registry") args.registry_path = v;
  if (flag == "--mode") {
    if (v != "off" && v != "full" && v != "selective" && v != "budget") {
      return absl::InvalidArgumentError(
          absl::StrCat("--mode '", v, "' is not allowed; allowed: off, full, selective, budget"));
    }
    args.mode = v;
  }
  if (flag == "--steps") {
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--steps '", v, "' is not allowed; allowed: a positive integer"));
    }
    args.steps = n;
  }
  return absl::OkStatus();
}

absl::StatusOr<int> parseNproc(const std::optional<std::string>& v) {
  char* end = nullptr;
  const long n = v ? std::strtol(v->c_str(), &end, 10) : 0;
  if (!v || end == v->c_str() || *end != '\0' || n < 1 || n > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc '", v.value_or(""), "' is not allowed; allowed: an integer in [1, 64]"));
  }
  return static_cast<int>(n);
}

// The flags that do not go together.
absl::Status checkCombinations(const Args& args) {
  if (args.config_path.empty()) return absl::InvalidArgumentError(absl::StrCat("--config is required\n", kUsage));
  if (args.compare && args.mode) {
    return absl::InvalidArgumentError("--compare runs every mode; do not combine it with --mode");
  }
  if (args.explain && (args.compare || args.nproc)) {
    return absl::InvalidArgumentError(
        "--explain runs one process and every mode; do not combine it with --compare or --nproc");
  }
  if (!args.explain && (!args.explain_json.empty() || !args.explain_svg.empty())) {
    return absl::InvalidArgumentError("--json and --svg go with --explain");
  }
  return absl::OkStatus();
}

// Parses and checks the command line; args.printed_help after --help or --version.
absl::StatusOr<Args> parseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (flag == "--nproc") {
      auto n = parseNproc(value());
      if (!n.ok()) return n.status();
      args.nproc = *n;
      continue;
    }
    args.rank_args.push_back(flag);
    if (i + 1 < argc && takesValue(flag)) args.rank_args.push_back(argv[i + 1]);
    if (hpac::printedHelpOrVersion(flag, "hpac-train", kUsage)) {
      args.printed_help = true;
      return args;
    } else if (flag == "--compare") {
      args.compare = true;
    } else if (flag == "--explain") {
      args.explain = true;
    } else if (flag == "--json" || flag == "--svg") {
      auto v = value();
      if (!v) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a file path\n", kUsage));
      (flag == "--json" ? args.explain_json : args.explain_svg) = *v;
    } else if (takesValue(flag)) {
      auto v = value();
      if (!v) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value\n", kUsage));
      if (absl::Status st = setValue(args, flag, *v); !st.ok()) return st;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", flag, "'\n", kUsage));
    }
  }
  if (absl::Status st = checkCombinations(args); !st.ok()) return st;
  return args;
}

struct Inputs {
  TrainConfig config;
  ModelRegistry registry;
};

// The config with the command line's overrides (--mode, --steps), and the model registry.
absl::StatusOr<Inputs> loadInputs(const Args& args) {
  auto config = loadConfig(args.config_path);
  if (!config.ok()) return config.status();
  if (args.mode) config->activation_checkpoint.mode = hpac::checkpointModeOrThrow(*args.mode);
  if (auto s = refuseMemoryTarget(*config); !s.ok()) return s;
  if (config->activation_checkpoint.usesBudget() && !config->activation_checkpoint.memory_budget &&
      !config->activation_checkpoint.memory_target) {
    return absl::InvalidArgumentError(absl::StrCat("--mode budget needs activation_checkpoint.memory_budget in ",
                                                   args.config_path,
                                                   " (a fraction in [0, 1], or bytes with a unit such as 64MiB)"));
  }
  if (args.steps) config->train.steps = *args.steps;
  absl::StatusOr<ModelRegistry> registry =
      args.registry_path.empty() ? builtinRegistry() : loadRegistry(args.registry_path);
  if (!registry.ok()) return registry.status();
  return Inputs{*std::move(config), *std::move(registry)};
}

int runExplain(const Args& args, const Inputs& in) {
  if (!args.explain_json.empty()) hpac::checkWritablePath(args.explain_json, "JSON");
  if (!args.explain_svg.empty()) hpac::checkWritablePath(args.explain_svg, "SVG");
  auto report = explainTraining(in.config, in.registry, in.config.activation_checkpoint.mode);
  if (!report.ok()) return fail(report.status());
  if (!args.explain_json.empty()) hpac::writeTextFile(args.explain_json, hpac::explainJson(*report), "JSON");
  if (!args.explain_svg.empty()) {
    hpac::writeTextFile(args.explain_svg,
                        hpac::timelineSvg(report->timelines, "hpac-train --explain: " + report->source), "SVG");
  }
  std::cout << hpac::formatExplainTable(*report);
  return 0;
}

// This process's part in the config's parallel layout: it launched the ranks
// (--nproc N > 1 outside a job: `launched` holds hpac-launch's exit status),
// or it is a rank of the job (`parallel`), or it runs alone (neither).
struct Ranks {
  std::optional<int> launched;
  std::shared_ptr<ParallelRuntime> parallel;
};

absl::StatusOr<Ranks> launchOrConnect(const Args& args, const TrainConfig& config) {
  const ParallelSpec& layout = config.parallel;
  if (layout.cp > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.config_path, ": parallel.cp ", layout.cp,
        ": hpac-train has no context parallel (it splits attention by heads, never by sequence); allowed: cp 1 "
        "here, or run the config under torchrun -m hpac.harness.dist_train, which uses torch's context_parallel "
        "on CUDA"));
  }
  const bool in_job = std::getenv("HPAC_RANK") != nullptr;
  if (args.nproc && !in_job) {
    if (*args.nproc != layout.worldSize()) {
      return absl::InvalidArgumentError(absl::StrCat("--nproc ", *args.nproc,
                                                     " does not match the config's parallel layout: tp (", layout.tp,
                                                     ") x dp (", layout.dp, ") = ", layout.worldSize(), " ranks"));
    }
    if (*args.nproc > 1) {
      hpac::dist::LaunchOptions launch;
      launch.nproc = *args.nproc;
      return Ranks{hpac::dist::launchRanks(launch, args.rank_args), nullptr};
    }
  }
  if (layout.distributed() && !in_job) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.config_path, ": parallel: tp (", layout.tp, ") x dp (", layout.dp, ") needs ", layout.worldSize(),
        " ranks: run hpac-train --nproc ", layout.worldSize(), " ... (or under hpac-launch --nproc ",
        layout.worldSize(), ")"));
  }
  Ranks ranks;
  if (layout.distributed()) {
    auto connected =
        connectParallel(config, effectiveSummary(config) + (args.compare ? "\nrun=compare" : "\nrun=train"));
    if (!connected.ok()) return connected.status();
    ranks.parallel = *std::move(connected);
  }
  return ranks;
}

// The model, the layout and the machine (rank 0 only).
void printHeader(const TrainConfig& config, const ParallelRuntime* parallel) {
  std::cout << "hpac-train: " << describe(config) << "\n";
  if (parallel) {
    const ParallelSpec& layout = config.parallel;
    std::cout << absl::StrFormat("hpac-train: parallel tp %d x dp %d (ep %d, fsdp %s) on %d ranks\n", layout.tp,
                                 layout.dp, layout.ep, layout.fsdp ? "on" : "off", parallel->world);
  }
  std::cout << "hpac-train: " << environmentLine() << std::endl;
}

// A parallel comparison's rank line and verdicts: exit status 1 when a
// composition rule broke on some rank or full / selective differ from the
// parallel off run; nullopt when the parity summary follows.
std::optional<int> reportRankCompare(const CompareResult& result, const ParallelRuntime& parallel) {
  const auto& rows = result.rows;
  std::cout << absl::StrFormat(
      "rank %d (tp %d, dp %d, ep %d): peak off %.3f MiB, full %.3f MiB, selective %.3f MiB; last step "
      "collectives in forward/recompute regions: full %d/%d, selective %d/%d; FSDP gathers selective %d/%d\n",
      parallel.rank, parallel.tp_rank, parallel.dp_rank, parallel.ep_rank,
      rows[0].peak_bytes / 1048576.0, rows[1].peak_bytes / 1048576.0, rows[2].peak_bytes / 1048576.0,
      rows[1].steps.back().collectives.saved_forward, rows[1].steps.back().collectives.saved_recompute,
      rows[2].steps.back().collectives.saved_forward, rows[2].steps.back().collectives.saved_recompute,
      rows[2].steps.back().collectives.gathers_forward, rows[2].steps.back().collectives.gathers_recompute);
  for (const std::string& f : result.failures) std::cout << "FAILED: " << f << "\n";
  const bool any_failure = allReduceScalar(result.failures.empty() ? 0 : 1, parallel.world_pg, true) > 0;
  if (any_failure) {
    std::cout << "FAILED: a composition rule broke on some rank (see the FAILED lines)\n";
    return 1;
  }
  if (parallel.rank == 0) {
    std::cout << "parity is against the 1-rank run (unsharded model, whole global batch), maxima over all "
                 "ranks; full/selective vs parallel off: "
              << (result.bitwise ? "bit for bit" : "NOT bit for bit") << "\n";
  }
  if (!result.bitwise) {
    std::cout << "MISMATCH: full or selective differs from the parallel off run\n";
    return 1;
  }
  return std::nullopt;
}

// The parity lines and the verdict (rank 0, or the only rank); exit status 0
// or 1.
int reportParity(const CompareResult& result, const TrainConfig& config, bool parallel) {
  std::cout << "peak_mem: peak tensor bytes above the step's start during forward+backward (max over steps); "
               "step_time: median of forward+backward+AdamW, modes interleaved step by step; peak_vs_off, "
               "time_vs_off: change against off (negative: less)\n";
  double worst_loss = 0, worst_grad = 0;
  for (const CompareRow& row : result.rows) {
    if (row.mode == hpac::CheckpointMode::kOff && !parallel) continue;
    std::cout << absl::StrFormat("parity %-9s vs %s over %d steps: max |dloss| %.3g, max |dgrad| %.3g%s\n",
                                 hpac::toString(row.mode), parallel ? "the 1-rank run" : "off", config.train.steps,
                                 row.max_loss_diff, row.max_grad_diff,
                                 row.worst_grad_at.empty() ? "" : " at " + row.worst_grad_at);
    worst_loss = std::max(worst_loss, row.max_loss_diff);
    worst_grad = std::max(worst_grad, row.max_grad_diff);
  }
  if (result.bitwise && !parallel) {
    std::cout << "OK: full and selective match off bit for bit (loss, input and parameter gradients, every step)"
              << (result.rows.size() > 3 ? absl::StrCat("; budget (memory_budget ",
                                                        config.activation_checkpoint.memory_budget->text, ") too")
                                         : std::string())
              << "\n";
    return 0;
  }
  if (worst_loss <= kTolerance && worst_grad <= kTolerance) {
    std::cout << "OK: " << (parallel ? "off, full and selective match the 1-rank run" : "full and selective match off")
              << " within the fp32 tolerance " << kTolerance << "\n";
    return 0;
  }
  std::cout << "MISMATCH: full or selective differs from off beyond " << kTolerance << "\n";
  return 1;
}

int runCompareCommand(const Inputs& in, const std::shared_ptr<ParallelRuntime>& parallel) {
  const bool lead = !parallel || parallel->rank == 0;
  auto result = runCompare(in.config, in.registry, std::cout, logToStderr, parallel);
  if (!result.ok()) return fail(result.status());
  if (lead) std::cout << "\n" << formatCompareTable(*result) << "\n";
  if (parallel) {
    if (std::optional<int> status = reportRankCompare(*result, *parallel)) return *status;
  }
  if (!lead) {
    double worst = 0;
    for (const CompareRow& row : result->rows) worst = std::max({worst, row.max_loss_diff, row.max_grad_diff});
    return worst <= kTolerance ? 0 : 1;
  }
  return reportParity(*result, in.config, parallel != nullptr);
}

// What the summary line reports of a run's steps.
struct TrainingTotals {
  std::vector<double> seconds;
  int64_t peak = -1, recomputed = 0, served = 0;  // recomputed, served: the last step's
  double first_loss = 0, last_loss = 0;

  void add(const StepResult& r) {
    if (seconds.empty()) first_loss = r.loss;
    last_loss = r.loss;
    seconds.push_back(r.seconds);
    peak = std::max(peak, r.peak_bytes);
    recomputed = r.stats.totals.recomputed;
    served = r.stats.totals.served;
  }
};

// The run's summary line and, per budget layer, its plan.
void printTrainingSummary(const Trainer& trainer, const TrainConfig& config, TrainingTotals t) {
  std::sort(t.seconds.begin(), t.seconds.end());
  const Preparation& prep = trainer.preparation();
  std::cout << absl::StrFormat(
      "summary [%s]: loss %.6f -> %.6f over %d steps, median step %.1f ms, peak %s; wrapped %d layers + %d "
      "submodules; last step: %d ops recomputed, %d served from cache\n",
      hpac::toString(config.activation_checkpoint.mode), t.first_loss, t.last_loss, config.train.steps,
      t.seconds[t.seconds.size() / 2] * 1e3,
      t.peak < 0 ? std::string("n/a (untracked)")
                 : absl::StrFormat("%.3f MiB", static_cast<double>(t.peak) / (1024.0 * 1024.0)),
      prep.layers_wrapped, prep.submodules_wrapped, t.recomputed, t.served);
  for (const PreparedLayer& p : prep.layers) {
    if (!p.setting.budget) continue;
    const hpac::BudgetRegion::Status st = p.setting.budget->status();
    std::cout << absl::StrFormat("budget %s: %s after %d profiles, %d replans; plan keeps %d bytes (budget %d; off "
                                 "keeps %d, all outputs %d), %d of %d ops; the recompute skips %d\n",
                                 p.layer.path, hpac::toString(st.stage), st.profiles, st.replans, st.plan.kept_bytes,
                                 st.plan.budget_bytes, st.plan.off_bytes, st.plan.total_bytes,
                                 std::count(st.plan.save.begin(), st.plan.save.end(), true), st.plan.save.size(),
                                 std::count(st.plan.skip.begin(), st.plan.skip.end(), true));
  }
}

// The config's mode for train.steps steps: one line per step (rank 0 only), then the summary.
int runTraining(const Inputs& in, const std::shared_ptr<ParallelRuntime>& parallel) {
  const TrainConfig& config = in.config;
  auto trainer = Trainer::create(config, in.registry, logToStderr, parallel);
  if (!trainer.ok()) return fail(trainer.status());
  const bool lead = !parallel || parallel->rank == 0;
  TrainingTotals totals;
  for (int64_t s = 0; s < config.train.steps; ++s) {
    const StepResult r = (*trainer)->step(s);
    if (lead) {
      std::cout << formatStepLine(r, config.train.steps, config.activation_checkpoint.mode)
                << (parallel ? formatCollectives(r.collectives) : "") << "\n";
    }
    totals.add(r);
  }
  printTrainingSummary(**trainer, config, std::move(totals));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  auto args = parseArgs(argc, argv);
  if (!args.ok()) return fail(args.status());
  if (args->printed_help) return 0;
  auto inputs = loadInputs(*args);
  if (!inputs.ok()) return fail(inputs.status());
  if (args->explain) return runExplain(*args, *inputs);
  auto ranks = launchOrConnect(*args, inputs->config);
  if (!ranks.ok()) return fail(ranks.status());
  if (ranks->launched) return *ranks->launched;
  if (!ranks->parallel || ranks->parallel->rank == 0) printHeader(inputs->config, ranks->parallel.get());
  return args->compare ? runCompareCommand(*inputs, ranks->parallel) : runTraining(*inputs, ranks->parallel);
} catch (const c10::Error& e) {
  std::cerr << "hpac-train: " << e.what_without_backtrace() << "\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "hpac-train: " << e.what() << "\n";
  return 2;
}
