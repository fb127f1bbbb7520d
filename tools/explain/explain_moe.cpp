#include "tools/explain/explain_moe.h"

#include "policy/budget_policy.h"
#include "policy/selective_policy.h"
#include "replay/checkpoint.h"
#include "tools/moe/moe_block.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <sstream>

namespace hpac {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// One factory per block for `mode`; empty for off. Budget regions are per block (their op sequences differ).
std::vector<PolicyFactory> policiesFor(const std::string& mode, size_t blocks, double budget) {
  std::vector<PolicyFactory> out(blocks);
  for (PolicyFactory& f : out) {
    if (mode == "full") f = recomputeAllPolicy();
    if (mode == "selective") f = selectivePolicy();
    if (mode == "budget") {
      BudgetSpec spec;
      spec.fraction = budget;
      f = budgetPolicy(spec);
    }
  }
  return out;
}

// One step (forward, loss, backward) with every block checkpointed by its
// factory (none: off); block `region` records into `recorder` when set.
void step(const std::vector<MoeBlock>& blocks, const at::Tensor& input, const std::vector<PolicyFactory>& policies,
          bool off, int64_t region, const std::shared_ptr<DecisionRecorder>& recorder,
          const std::shared_ptr<InvocationStats>& stats, TimelineCapture* timeline, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor h = input.detach().clone().set_requires_grad(true);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const MoeBlock& block = blocks[i];
    if (off) {
      h = block.forward(h);
      continue;
    }
    CheckpointOptions options;
    options.policy = policies[i];
    if (static_cast<int64_t>(i) == region) {
      options.explain = recorder;
      options.stats_out = stats;
    }
    h = checkpoint([&block](const at::Tensor& in) { return block.forward(in); }, h, options);
  }
  at::Tensor loss = h.pow(2).mean();
  if (timeline != nullptr) timeline->mark("backward");
  loss.backward();
}

// Before a step's capture: the previous step's gradients are freed here, not inside the next timeline.
void resetGrads(const std::vector<MoeBlock>& blocks) {
  for (const MoeBlock& b : blocks) {
    for (at::Tensor p : b.parameters()) {
      if (p.grad().defined()) p.mutable_grad().reset();
    }
  }
}

}  // namespace

const std::vector<std::string>& explainModeNames() {
  static const std::vector<std::string> names = {"off", "full", "selective", "budget"};
  return names;
}

void checkExplainMode(const std::string& mode, bool explained) {
  const auto& names = explainModeNames();
  TORCH_CHECK(std::find(names.begin(), names.end(), mode) != names.end(), "hpac explain: unknown mode '", mode,
              "'; allowed: ", joined(names));
  TORCH_CHECK(!explained || mode != "off", "hpac explain: mode 'off' checkpoints no region, so there is nothing "
              "to explain; allowed: full, selective, budget");
}

ExplainReport explainMoeBlocks(const MoeExplainOptions& o) {
  checkExplainMode(o.mode, /*explained=*/true);
  for (const std::string& m : o.timeline_modes) checkExplainMode(m, /*explained=*/false);
  TORCH_CHECK(o.blocks >= 1 && o.blocks <= 64, "hpac explain: blocks ", o.blocks, " is not allowed; allowed: 1 to 64");
  TORCH_CHECK(o.region >= 0 && o.region < o.blocks, "hpac explain: unknown region ", o.region, "; allowed: a block "
              "index in [0, ", o.blocks - 1, "] (the stack has ", o.blocks, " blocks)");
  TORCH_CHECK(o.budget >= 0 && o.budget <= 1, "hpac explain: budget ", o.budget, " is outside [0, 1]; allowed: a "
              "fraction of what the region keeps under off");
  TORCH_CHECK(o.batch >= 1 && o.seq >= 1, "hpac explain: batch ", o.batch, " and seq ", o.seq,
              " must be positive integers");

  MoeBlockConfig config;
  std::vector<MoeBlock> blocks;
  for (int64_t b = 0; b < o.blocks; ++b) blocks.emplace_back(config, o.seed + 1 + static_cast<uint64_t>(b));
  at::manual_seed(o.seed);
  const at::Tensor input = at::randn({o.batch, o.seq, config.hidden});

  ExplainReport report;
  std::ostringstream source;
  source << "MoE block stack (" << o.blocks << " blocks, hidden " << config.hidden << ", " << config.experts
         << " experts top-" << config.top_k << ", batch " << o.batch << " x seq " << o.seq << ", seed " << o.seed
         << (o.mode == "budget" || std::count(o.timeline_modes.begin(), o.timeline_modes.end(), "budget")
                 ? ", budget " + std::to_string(o.budget).substr(0, 4)
                 : std::string())
         << ")";
  report.source = source.str();
  report.region = "block " + std::to_string(o.region);
  report.mode = o.mode;

  std::vector<std::string> modes = o.timeline_modes;
  if (std::find(modes.begin(), modes.end(), o.mode) == modes.end()) modes.push_back(o.mode);
  for (const std::string& mode : modes) {
    const std::vector<PolicyFactory> policies = policiesFor(mode, blocks.size(), o.budget);
    const bool off = mode == "off";
    resetGrads(blocks);
    if (mode == "budget") {  // the profile step; the explained step replays its plan
      step(blocks, input, policies, off, -1, nullptr, nullptr, nullptr, o.seed);
    }
    const bool explained = mode == o.mode;
    auto recorder = explained ? std::make_shared<DecisionRecorder>() : nullptr;
    auto stats = std::make_shared<InvocationStats>();
    TimelineTrace trace;
    {
      resetGrads(blocks);
      TimelineCapture capture;
      step(blocks, input, policies, off, o.region, recorder, stats, &capture, o.seed);
      trace = capture.finish(mode);
    }
    if (std::find(o.timeline_modes.begin(), o.timeline_modes.end(), mode) != o.timeline_modes.end()) {
      report.timelines.push_back(std::move(trace));
    }
    if (explained) {
      report.ops = recorder->ops();
      report.stats = *stats;
    }
  }
  return report;
}

}  // namespace hpac
