// hpac-train: trains a model of the zoo under the YAML config's activation
// checkpointing mode, or compares off / full / selective (--compare).
//
//   hpac-train --config examples/training_demo/train.yaml [--mode off|full|selective]
//              [--compare] [--steps N] [--registry PATH]
//
// Exit status: 0 ok; 1 the comparison found full or selective off the
// no-checkpoint run beyond the fp32 tolerance; 2 bad command line, config or
// model preparation.
#include "tools/trainer/config.h"
#include "tools/trainer/registry.h"
#include "tools/trainer/trainer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

namespace {

const char* kUsage =
    "usage: hpac-train --config FILE [--mode off|full|selective] [--compare] [--steps N] [--registry FILE]\n"
    "  --config    trainer YAML (e.g. examples/training_demo/train.yaml)\n"
    "  --mode      override activation_checkpoint.mode\n"
    "  --compare   train off, full and selective from the same seed and print the comparison table\n"
    "  --steps     override train.steps\n"
    "  --registry  model registry YAML (default: the one shipped with hpac)";

// Tolerance for a comparison that is not bit for bit (fp32 CPU).
constexpr double kTolerance = 1e-5;

int fail(const std::string& message) {
  std::cerr << "hpac-train: " << message << "\n";
  return 2;
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
  bool compare = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage << "\n";
      return 0;
    } else if (flag == "--compare") {
      compare = true;
    } else if (flag == "--config" || flag == "--mode" || flag == "--steps" || flag == "--registry") {
      auto v = value();
      if (!v) return fail(absl::StrCat(flag, " needs a value\n", kUsage));
      if (flag == "--config") config_path = *v;
      if (flag == "--registry") registry_path = *v;
      if (flag == "--mode") {
        if (*v != "off" && *v != "full" && *v != "selective") {
          return fail(absl::StrCat("--mode '", *v, "' is not allowed; allowed: off, full, selective"));
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

  auto config = loadConfig(config_path);
  if (!config.ok()) return fail(std::string(config.status().message()));
  if (mode) config->activation_checkpoint.mode = hpac::parseMode(*mode);
  if (steps) config->train.steps = *steps;

  absl::StatusOr<ModelRegistry> registry =
      registry_path.empty() ? builtinRegistry() : loadRegistry(registry_path);
  if (!registry.ok()) return fail(std::string(registry.status().message()));

  std::cout << "hpac-train: " << describe(*config) << "\n";
  std::cout << "hpac-train: " << environmentLine() << std::endl;

  if (compare) {
    auto result = runCompare(*config, *registry, std::cout);
    if (!result.ok()) return fail(std::string(result.status().message()));
    std::cout << "\n" << formatCompareTable(*result) << "\n";
    std::cout << "peak_mem: peak tensor bytes above the step's start during forward+backward (max over steps); "
                 "step_time: median of forward+backward+AdamW, modes interleaved step by step\n";
    double worst_loss = 0, worst_grad = 0;
    for (const CompareRow& row : result->rows) {
      if (row.mode == hpac::Mode::kOff) continue;
      std::cout << absl::StrFormat("parity %-9s vs off over %d steps: max |dloss| %.3g, max |dgrad| %.3g\n",
                                   hpac::toString(row.mode), config->train.steps, row.max_loss_diff,
                                   row.max_grad_diff);
      worst_loss = std::max(worst_loss, row.max_loss_diff);
      worst_grad = std::max(worst_grad, row.max_grad_diff);
    }
    if (result->bitwise) {
      std::cout << "OK: full and selective match off bit for bit (loss, input and parameter gradients, every step)\n";
      return 0;
    }
    if (worst_loss <= kTolerance && worst_grad <= kTolerance) {
      std::cout << "OK: full and selective match off within the fp32 tolerance " << kTolerance << "\n";
      return 0;
    }
    std::cout << "MISMATCH: full or selective differs from off beyond " << kTolerance << "\n";
    return 1;
  }

  auto trainer = Trainer::create(*config, *registry);
  if (!trainer.ok()) return fail(std::string(trainer.status().message()));
  const hpac::Mode m = config->activation_checkpoint.mode;
  std::vector<double> seconds;
  int64_t peak = -1, recomputed = 0, served = 0;
  double first_loss = 0, last_loss = 0;
  for (int64_t s = 0; s < config->train.steps; ++s) {
    const StepResult r = (*trainer)->step(s);
    std::cout << formatStepLine(r, config->train.steps, m) << "\n";
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
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "hpac-train: " << e.what_without_backtrace() << "\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "hpac-train: " << e.what() << "\n";
  return 2;
}
