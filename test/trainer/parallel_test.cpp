// The expert-parallel MoE block of the Qwen3-MoE replica on two Gloo ranks
// (threads of this process, loopback), against the unsharded block on the
// whole batch. The router is rigged so that every token picks experts of rank
// 0: rank 1 receives nothing and runs no expert, yet its dispatch, combine and
// their backward must still run (or rank 0 would wait for it forever). For
// off, full and selective: outputs, input gradients and the owned experts'
// gradients equal the 1-rank block's; selective re-issues no send/recv in the
// recompute, full re-issues exactly the forward's.
#include "policy/selective_policy.h"
#include "replay/checkpoint.h"
#include "test/support/parity.h"
#include "tools/evidence/evidence.h"
#include "tools/trainer/parallel.h"
#include "tools/trainer/qwen3_moe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <map>
#include <thread>

namespace hpac::trainer {
namespace {

constexpr int kRanks = 2;
constexpr int64_t kTokens = 6;  // per rank

ModelSpec spec() {
  ModelSpec s;  // qwen3_moe_tiny: hidden 64, 8 experts, top-2
  s.num_layers = 1;
  s.moe_intermediate_size = 16;
  return s;
}

// One layer's MoE block, initialised identically on every rank, with a router
// that sends every (positive) token to experts 0..3 — all on EP rank 0.
std::shared_ptr<Qwen3MoeForCausalLM> riggedModel() {
  auto model = std::dynamic_pointer_cast<Qwen3MoeForCausalLM>(makeZooModel(spec(), 11));
  torch::NoGradGuard no_grad;
  at::Tensor gate = model->model->layers->ptr<Qwen3MoeDecoderLayerImpl>(0)->mlp->gate->weight;
  gate.abs_();
  gate.narrow(0, 4, 4).neg_();
  return model;
}

Qwen3MoeSparseMoeBlockImpl& moe(Qwen3MoeForCausalLM& m) { return *m.model->layers->ptr<Qwen3MoeDecoderLayerImpl>(0)->mlp; }

at::Tensor batch() {
  at::Generator gen = at::detail::createCPUGenerator(5);
  return at::rand({kRanks * kTokens, spec().hidden_size}, gen) + 0.1;  // positive
}

struct RankRun {
  at::Tensor out, input_grad;
  std::map<std::string, at::Tensor> expert_grads;  // 1-rank names
  int64_t experts_hit = -1;
  int64_t p2p_forward = -1, p2p_recompute = -1;
};

RankRun runRank(int rank, const c10::intrusive_ptr<c10d::Store>& store, CheckpointMode mode) {
  auto rt = std::make_shared<ParallelRuntime>();
  rt->spec.dp = kRanks;
  rt->spec.ep = kRanks;
  rt->model = spec();
  rt->rank = rank;
  rt->world = kRanks;
  rt->dp_rank = rt->ep_rank = rank;
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = [&](const std::string& name, int group_rank, int size) -> c10::intrusive_ptr<c10d::ProcessGroup> {
    return dist::countingGlooGroup(c10::make_intrusive<c10d::PrefixStore>(name, store), group_rank, size, options,
                                   &rt->counts);
  };
  rt->tp_pg = group("tp" + std::to_string(rank), 0, 1);
  rt->ep_pg = group("ep", rank, kRanks);

  auto model = riggedModel();
  shardQwen3Moe(*model, rt);
  const at::Tensor x = batch().narrow(0, rank * kTokens, kTokens).clone().set_requires_grad(true);
  auto block = [&](const at::Tensor& in) { return moe(*model).forward(in); };
  RankRun r;
  rt->counts.reset();
  at::Tensor y;
  if (mode == CheckpointMode::kOff) {
    y = block(x);
  } else {
    y = checkpoint(block, x, checkpointOptionsFor(mode));
  }
  r.experts_hit = moe(*model).lastExpertsHit();
  y.pow(2).sum().backward();
  r.out = y.detach();
  r.input_grad = x.grad();
  r.p2p_forward = rt->counts.send.forward + rt->counts.recv.forward;
  r.p2p_recompute = rt->counts.send.recompute + rt->counts.recv.recompute;
  for (const auto& item : model->named_parameters()) {
    if (item.key().find(".mlp.experts.") == std::string::npos) continue;
    r.expert_grads[shardRule(item.key(), *rt).full_name] = item.value().grad();
  }
  return r;
}

std::vector<RankRun> runRanks(CheckpointMode mode) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankRun> runs(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] { runs[rank] = runRank(rank, store, mode); });
  }
  for (auto& t : threads) t.join();
  return runs;
}

class ExpertParallelMoe : public ::testing::TestWithParam<CheckpointMode> {};

TEST_P(ExpertParallelMoe, MatchesTheUnshardedBlockWhenOneRankGetsNoToken) {
  const CheckpointMode mode = GetParam();
  auto reference = riggedModel();
  const at::Tensor x = batch().set_requires_grad(true);
  const at::Tensor y = moe(*reference).forward(x);
  y.pow(2).sum().backward();
  ASSERT_LE(moe(*reference).lastExpertsHit(), 4);

  const std::vector<RankRun> runs = runRanks(mode);
  EXPECT_GT(runs[0].experts_hit, 0);
  EXPECT_EQ(runs[1].experts_hit, 0) << "the rigged router should leave rank 1's experts idle";
  std::map<std::string, at::Tensor> want;
  for (const auto& item : reference->named_parameters()) want[item.key()] = item.value().grad();
  for (int rank = 0; rank < kRanks; ++rank) {
    const RankRun& r = runs[rank];
    EXPECT_TRUE(Matches({r.out}, {y.detach().narrow(0, rank * kTokens, kTokens)}, 1e-6)) << "rank " << rank;
    // Relative: the input gradient is ~1e-6 in magnitude, below any useful absolute tolerance.
    EXPECT_TRUE(MatchesScaled(r.input_grad, x.grad().narrow(0, rank * kTokens, kTokens), 1e-4, "input grad"))
        << "rank " << rank;
    EXPECT_EQ(r.expert_grads.size(), 3u * 4u) << "4 experts per rank, 3 projections each";
    for (const auto& [name, grad] : r.expert_grads) {
      EXPECT_TRUE(Matches({grad}, {want.at(name)}, 1e-5, {name})) << "rank " << rank;
    }
    // Per rank: the count tables both ways (a send and a receive), rank 1's
    // tokens to rank 0 (one message), their results back (one message); the
    // empty chunks are skipped on both sides.
    EXPECT_EQ(r.p2p_forward, mode == CheckpointMode::kOff ? 0 : 4) << "rank " << rank;
    EXPECT_EQ(r.p2p_recompute, mode == CheckpointMode::kFull ? r.p2p_forward : 0) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ExpertParallelMoe, ::testing::Values(CheckpointMode::kOff, CheckpointMode::kFull, CheckpointMode::kSelective),
                         [](const auto& info) { return std::string(toString(info.param)); });

}  // namespace
}  // namespace hpac::trainer
