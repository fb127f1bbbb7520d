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

std::string selfExecutable() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string("hpac-train");
}

std::string describe(const hpac::trainer::TrainConfig& c) {
  const auto& m = c.model;
  return absl::StrFormat(
      "model %s: %d layers, hidden %d, heads %d/%d kv, head_dim %d, experts %d top-%d (moe_intermediate %d), "
      "vocab %d; seq %d x batch %d, %d steps, AdamW lr %g, seed %d, %s",
      m.preset, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim,
      m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.vocab_size, c.train.seq_len,
      c.train.micro_batch, c.train.steps, c.train.lr, c.train.seed, c.train.dtype);
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace hpac::trainer;
  std::string config_path, registry_path;
  std::optional<std::string> mode;
  std::optional<int64_t> steps;
  std::optional<int> nproc;
  std::vector<std::string> rank_args{selfExecutable()};  // the command line each rank runs (no --nproc)
  bool compare = false, explain = false;
  std::string explain_json, explain_svg;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (flag == "--nproc") {
      auto v = value();
      char* end = nullptr;
      const long n = v ? std::strtol(v->c_str(), &end, 10) : 0;
      if (!v || end == v->c_str() || *end != '\0' || n < 1 || n > 64) {
        return fail(absl::StrCat("--nproc '", v.value_or(""), "' is not allowed; allowed: an integer in [1, 64]"));
      }
      nproc = static_cast<int>(n);
      continue;
    }
    rank_args.push_back(flag);
    if (i + 1 < argc && (flag == "--config" || flag == "--mode" || flag == "--steps" || flag == "--registry")) {
      rank_args.push_back(argv[i + 1]);
    }
    if (hpac::printedHelpOrVersion(flag, "hpac-train", kUsage)) {
      return 0;
    } else if (flag == "--compare") {
      compare = true;
    } else if (flag == "--explain") {
      explain = true;
    } else if (flag == "--json" || flag == "--svg") {
      auto v = value();
      if (!v) return fail(absl::StrCat(flag, " needs a file path\n", kUsage));
      (flag == "--json" ? explain_json : explain_svg) = *v;
    } else if (flag == "--config" || flag == "--mode" || flag == "--steps" || flag == "--registry") {
      auto v = value();
      if (!v) return fail(absl::StrCat(flag, " needs a value\n", kUsage));
      if (flag == "--config") config_path = *v;
      if (flag == "--registry") registry_path = *v;
      if (flag == "--mode") {
        if (*v != "off" && *v != "full" && *v != "selective" && *v != "budget") {
          return fail(absl::StrCat("--mode '", *v, "' is not allowed; allowed: off, full, selective, budget"));
        }
        mode = *v;
      }
      if (flag == "--steps") {
        char* end = nullptr;
        const long long n = std::strtoll(v->c_str(), &end, 10);
        if (end == v->c_str() || *end != '\0' || n < 1) {
          return fail(absl::StrCat("--steps '", *v, "' is not allowed; allowed: a positive integer"));
        }
        steps = n;
      }
    } else {
      return fail(absl::StrCat("unknown argument '", flag, "'\n", kUsage));
    }
  }
  if (config_path.empty()) return fail(absl::StrCat("--config is required\n", kUsage));
  if (compare && mode) return fail("--compare runs every mode; do not combine it with --mode");
  if (explain && (compare || nproc)) return fail("--explain runs one process and every mode; do not combine it with --compare or --nproc");
  if (!explain && (!explain_json.empty() || !explain_svg.empty())) return fail("--json and --svg go with --explain");

  auto config = loadConfig(config_path);
  if (!config.ok()) return fail(std::string(config.status().message()));
  if (mode) config->activation_checkpoint.mode = hpac::checkpointModeOrThrow(*mode);
  if (config->activation_checkpoint.usesBudget() && !config->activation_checkpoint.memory_budget) {
    return fail(absl::StrCat("--mode budget needs activation_checkpoint.memory_budget in ", config_path,
                             " (a fraction in [0, 1], or bytes with a unit such as 64MiB)"));
  }
  if (steps) config->train.steps = *steps;

  absl::StatusOr<ModelRegistry> registry =
      registry_path.empty() ? builtinRegistry() : loadRegistry(registry_path);
  if (!registry.ok()) return fail(std::string(registry.status().message()));

  if (explain) {
    if (!explain_json.empty()) hpac::checkWritablePath(explain_json, "JSON");
    if (!explain_svg.empty()) hpac::checkWritablePath(explain_svg, "SVG");
    auto report = explainTraining(*config, *registry, config->activation_checkpoint.mode);
    if (!report.ok()) return fail(std::string(report.status().message()));
    if (!explain_json.empty()) hpac::writeTextFile(explain_json, hpac::explainJson(*report), "JSON");
    if (!explain_svg.empty()) {
      hpac::writeTextFile(explain_svg, hpac::timelineSvg(report->timelines, "hpac-train --explain: " + report->source),
                          "SVG");
    }
    std::cout << hpac::formatExplainTable(*report);
    return 0;
  }

  const ParallelSpec& layout = config->parallel;
  if (layout.cp > 1) {
    return fail(absl::StrCat(config_path, ": parallel.cp ", layout.cp,
                             ": hpac-train has no context parallel (it splits attention by heads, never by "
                             "sequence); allowed: cp 1 here, or run the config under torchrun -m hpac.dist_train, "
                             "which uses torch's context_parallel on CUDA"));
  }
  const bool in_job = std::getenv("HPAC_RANK") != nullptr;
  if (nproc && !in_job) {
    if (*nproc != layout.worldSize()) {
      return fail(absl::StrCat("--nproc ", *nproc, " does not match the config's parallel layout: tp (", layout.tp,
                               ") x dp (", layout.dp, ") = ", layout.worldSize(), " ranks"));
    }
    if (*nproc > 1) {
      hpac::dist::LaunchOptions launch;
      launch.nproc = *nproc;
      return hpac::dist::launchRanks(launch, rank_args);
    }
  }
  if (layout.distributed() && !in_job) {
    return fail(absl::StrCat(config_path, ": parallel: tp (", layout.tp, ") x dp (", layout.dp, ") needs ",
                             layout.worldSize(), " ranks: run hpac-train --nproc ", layout.worldSize(),
                             " ... (or under hpac-launch --nproc ", layout.worldSize(), ")"));
  }
  std::shared_ptr<ParallelRuntime> parallel;
  if (layout.distributed()) {
    auto connected = connectParallel(*config, effectiveSummary(*config) + (compare ? "\nrun=compare" : "\nrun=train"));
    if (!connected.ok()) return fail(std::string(connected.status().message()));
    parallel = *std::move(connected);
  }
  const bool lead = !parallel || parallel->rank == 0;
  if (lead) {
    std::cout << "hpac-train: " << describe(*config) << "\n";
    if (parallel) {
      std::cout << absl::StrFormat("hpac-train: parallel tp %d x dp %d (ep %d, fsdp %s) on %d ranks\n", layout.tp,
                                   layout.dp, layout.ep, layout.fsdp ? "on" : "off", parallel->world);
    }
    std::cout << "hpac-train: " << environmentLine() << std::endl;
  }

  if (compare) {
    auto result = runCompare(*config, *registry, std::cout, logToStderr, parallel);
    if (!result.ok()) return fail(std::string(result.status().message()));
    if (lead) std::cout << "\n" << formatCompareTable(*result) << "\n";
    if (parallel) {
      const auto& rows = result->rows;
      std::cout << absl::StrFormat(
          "rank %d (tp %d, dp %d, ep %d): peak off %.3f MiB, full %.3f MiB, selective %.3f MiB; last step "
          "collectives in forward/recompute regions: full %d/%d, selective %d/%d; FSDP gathers selective %d/%d\n",
          parallel->rank, parallel->tp_rank, parallel->dp_rank, parallel->ep_rank,
          rows[0].peak_bytes / 1048576.0, rows[1].peak_bytes / 1048576.0, rows[2].peak_bytes / 1048576.0,
          rows[1].steps.back().collectives.saved_forward, rows[1].steps.back().collectives.saved_recompute,
          rows[2].steps.back().collectives.saved_forward, rows[2].steps.back().collectives.saved_recompute,
          rows[2].steps.back().collectives.gathers_forward, rows[2].steps.back().collectives.gathers_recompute);
      for (const std::string& f : result->failures) std::cout << "FAILED: " << f << "\n";
      const bool any_failure = allReduceScalar(result->failures.empty() ? 0 : 1, parallel->world_pg, true) > 0;
      if (any_failure) {
        std::cout << "FAILED: a composition rule broke on some rank (see the FAILED lines)\n";
        return 1;
      }
      if (lead) {
        std::cout << "parity is against the 1-rank run (unsharded model, whole global batch), maxima over all "
                     "ranks; full/selective vs parallel off: "
                  << (result->bitwise ? "bit for bit" : "NOT bit for bit") << "\n";
      }
      if (!result->bitwise) {
        std::cout << "MISMATCH: full or selective differs from the parallel off run\n";
        return 1;
      }
    }
    if (!lead) {
      double worst = 0;
      for (const CompareRow& row : result->rows) worst = std::max({worst, row.max_loss_diff, row.max_grad_diff});
      return worst <= kTolerance ? 0 : 1;
    }
    std::cout << "peak_mem: peak tensor bytes above the step's start during forward+backward (max over steps); "
                 "step_time: median of forward+backward+AdamW, modes interleaved step by step\n";
    double worst_loss = 0, worst_grad = 0;
    for (const CompareRow& row : result->rows) {
      if (row.mode == hpac::CheckpointMode::kOff && !parallel) continue;
      std::cout << absl::StrFormat("parity %-9s vs %s over %d steps: max |dloss| %.3g, max |dgrad| %.3g%s\n",
                                   hpac::toString(row.mode), parallel ? "the 1-rank run" : "off",
                                   config->train.steps, row.max_loss_diff, row.max_grad_diff,
                                   row.worst_grad_at.empty() ? "" : " at " + row.worst_grad_at);
      worst_loss = std::max(worst_loss, row.max_loss_diff);
      worst_grad = std::max(worst_grad, row.max_grad_diff);
    }
    if (result->bitwise && !parallel) {
      std::cout << "OK: full and selective match off bit for bit (loss, input and parameter gradients, every step)"
                << (result->rows.size() > 3 ? absl::StrCat("; budget (memory_budget ",
                                                           config->activation_checkpoint.memory_budget->text,
                                                           ") too")
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

  auto trainer = Trainer::create(*config, *registry, logToStderr, parallel);
  if (!trainer.ok()) return fail(std::string(trainer.status().message()));
  const hpac::CheckpointMode m = config->activation_checkpoint.mode;
  std::vector<double> seconds;
  int64_t peak = -1, recomputed = 0, served = 0;
  double first_loss = 0, last_loss = 0;
  for (int64_t s = 0; s < config->train.steps; ++s) {
    const StepResult r = (*trainer)->step(s);
    if (lead) {
      std::cout << formatStepLine(r, config->train.steps, m)
                << (parallel ? absl::StrFormat("  collectives fwd/recompute %d/%d  gathers %d/%d",
                                               r.collectives.saved_forward, r.collectives.saved_recompute,
                                               r.collectives.gathers_forward, r.collectives.gathers_recompute)
                             : "")
                << "\n";
    }
    if (s == 0) first_loss = r.loss;
    last_loss = r.loss;
    seconds.push_back(r.seconds);
    peak = std::max(peak, r.peak_bytes);
    recomputed = r.stats.totals.recomputed;
    served = r.stats.totals.served;
  }
  std::sort(seconds.begin(), seconds.end());
  const Preparation& prep = (*trainer)->preparation();
  std::cout << absl::StrFormat(
      "summary [%s]: loss %.6f -> %.6f over %d steps, median step %.1f ms, peak %s; wrapped %d layers + %d "
      "submodules; last step: %d ops recomputed, %d served from cache\n",
      hpac::toString(m), first_loss, last_loss, config->train.steps, seconds[seconds.size() / 2] * 1e3,
      peak < 0 ? std::string("n/a (untracked)")
               : absl::StrFormat("%.3f MiB", static_cast<double>(peak) / (1024.0 * 1024.0)),
      prep.layers_wrapped, prep.submodules_wrapped, recomputed,
      served);
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
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "hpac-train: " << e.what_without_backtrace() << "\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "hpac-train: " << e.what() << "\n";
  return 2;
}
