// Collectives inside checkpoint regions, on two Gloo ranks (threads of this
// process, loopback): selective saves the in-place c10d::allreduce_ and serves
// it in the recompute without re-issuing it (process-group calls per rank:
// forward 1, recompute 0); full re-issues it symmetrically on both ranks; both
// give gradients bit-identical to the same step without checkpointing.
// See Note [In-place collectives] in replay/collective_work.cpp.
//
// The expert-parallel all-to-all (tools/distributed/parallel_ops.cpp, built from c10d::send and
// c10d::recv_ because Gloo on 1.13 has no alltoall) on three ranks: selective
// serves both sides in the recompute and re-issues nothing; full re-issues
// them symmetrically; gradients bit-identical to no checkpointing.
#include "policy/selective_policy.h"
#include "tools/distributed/counting_group.h"
#include "tools/distributed/parallel_ops.h"
#include "replay/checkpoint.h"
#include "test/support/parity.h"
#include "tools/evidence/evidence.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <thread>

namespace hpac {
namespace {

// Row-parallel reduction: sum of the ranks' partial results in forward,
// gradient passed through unchanged in backward (each rank owns its shard).
struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& partial,
                            c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    std::vector<at::Tensor> out{partial.clone()};
    dist::allReduce(pg, out)->wait();  // through the dispatcher: c10d::allreduce_
    return out[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

// `layer(x)` as is (off), or checkpointed whole (full) or with the selective policy.
template <typename Layer>
at::Tensor runInMode(const Layer& layer, const at::Tensor& x, CheckpointMode mode, const std::shared_ptr<InvocationStats>& stats) {
  if (mode == CheckpointMode::kOff) return layer(x);
  CheckpointOptions o = checkpointOptionsFor(mode);
  o.stats_out = stats;
  return checkpoint(layer, x, o);
}

struct RankResult {
  std::vector<at::Tensor> grads;
  int forward_calls = -1;
  int total_calls = -1;
  InvocationStats stats;
};

RankResult runRank(int rank, const c10::intrusive_ptr<c10d::Store>& store, CheckpointMode mode) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  dist::CollectiveCounts counts;
  auto pg = dist::countingGlooGroup(store, rank, 2, options, &counts);
  // Rank threads run concurrently: each draws from its own generator, never the global one.
  at::Generator shard_gen = at::detail::createCPUGenerator(100 + rank);  // each rank owns a different shard
  at::Generator input_gen = at::detail::createCPUGenerator(7);           // the same input on both ranks
  const at::Tensor w_in = at::randn({8, 8}, shard_gen).set_requires_grad(true);
  const at::Tensor w_out = at::randn({8, 8}, shard_gen).set_requires_grad(true);
  const at::Tensor x = at::randn({4, 8}, input_gen).set_requires_grad(true);
  auto layer = [&](const at::Tensor& in) {
    const at::Tensor partial = at::mm(at::relu(at::mm(in, w_in)), w_out);
    return at::tanh(AllReduceSum::apply(partial, pg));
  };
  RankResult r;
  auto stats = std::make_shared<InvocationStats>();
  {
    const at::Tensor y = runInMode(layer, x, mode, stats);
    r.forward_calls = static_cast<int>(counts.allreduce.total());
    y.pow(2).sum().backward();
  }
  r.total_calls = static_cast<int>(counts.allreduce.total());
  r.stats = *stats;
  r.grads = {x.grad(), w_in.grad(), w_out.grad()};
  return r;
}

// Runs `rank_fn(rank, store)` for `n` ranks, each on its own thread, over one store.
template <typename Result, typename RankFn>
std::vector<Result> runRanks(int n, RankFn rank_fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Result> results(n);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < n; ++rank) {
    ranks.emplace_back([&, rank] { results[rank] = rank_fn(rank, store); });
  }
  for (auto& t : ranks) t.join();
  return results;
}

std::vector<RankResult> runTwoRanks(CheckpointMode mode) {
  return runRanks<RankResult>(2, [mode](int rank, const auto& store) { return runRank(rank, store, mode); });
}

TEST(Collectives, SelectiveServesTheAllReduceWithoutReissuingIt) {
  const auto off = runTwoRanks(CheckpointMode::kOff);
  const auto sel = runTwoRanks(CheckpointMode::kSelective);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(off[rank].total_calls, 1);
    EXPECT_EQ(sel[rank].forward_calls, 1) << "rank " << rank;
    EXPECT_EQ(sel[rank].total_calls, 1) << "rank " << rank << ": the recompute re-issued the collective";
    EXPECT_GE(sel[rank].stats.served, 1);
    EXPECT_TRUE(Matches(sel[rank].grads, off[rank].grads)) << "rank " << rank;
  }
}

TEST(Collectives, FullReissuesTheAllReduceSymmetrically) {
  const auto off = runTwoRanks(CheckpointMode::kOff);
  const auto full = runTwoRanks(CheckpointMode::kFull);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(full[rank].forward_calls, 1);
    EXPECT_EQ(full[rank].total_calls, 2) << "rank " << rank << ": forward 1 + recompute 1";
    EXPECT_TRUE(Matches(full[rank].grads, off[rank].grads)) << "rank " << rank;
  }
}

// Three ranks exchange rows (uneven counts, one pair exchanging nothing), each
// applies its own "expert" weight to what it received, and sends the results
// back: the dispatch / combine of an expert-parallel MoE layer.
struct ExchangeResult {
  std::vector<at::Tensor> grads;
  int64_t sends_forward = -1, recvs_forward = -1, sends_recompute = -1, recvs_recompute = -1, sends_total = -1;
  int64_t expected_sends = 0;  // non-empty chunks to peers: dispatch + combine
  InvocationStats stats;
};

ExchangeResult runExchangeRank(int rank, const c10::intrusive_ptr<c10d::Store>& store, CheckpointMode mode) {
  constexpr int kRanks = 3;
  dist::CollectiveCounts counts;
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  c10::intrusive_ptr<c10d::ProcessGroup> pg = dist::countingGlooGroup(store, rank, kRanks, options, &counts);
  // send[r][d]: rows rank r sends to rank d (rank 0 sends nothing to rank 2).
  const int64_t send[kRanks][kRanks] = {{2, 3, 0}, {1, 1, 2}, {3, 2, 1}};
  std::vector<int64_t> send_counts, recv_counts;
  for (int d = 0; d < kRanks; ++d) send_counts.push_back(send[rank][d]);
  for (int s = 0; s < kRanks; ++s) recv_counts.push_back(send[s][rank]);
  ExchangeResult r;
  for (int peer = 0; peer < kRanks; ++peer) {
    if (peer != rank) r.expected_sends += (send_counts[peer] > 0) + (recv_counts[peer] > 0);
  }
  at::Generator gen = at::detail::createCPUGenerator(200 + rank);
  const at::Tensor expert = at::randn({6, 6}, gen).set_requires_grad(true);
  const at::Tensor x = at::randn({send_counts[0] + send_counts[1] + send_counts[2], 6}, gen).set_requires_grad(true);
  auto layer = [&](const at::Tensor& in) {
    const at::Tensor received = dist::allToAll(at::tanh(in), send_counts, recv_counts, pg);
    const at::Tensor processed = at::relu(at::mm(received, expert));
    return dist::allToAll(processed, recv_counts, send_counts, pg) * in;
  };
  auto stats = std::make_shared<InvocationStats>();
  runInMode(layer, x, mode, stats).pow(2).sum().backward();
  r.sends_forward = counts.send.forward;
  r.recvs_forward = counts.recv.forward;
  r.sends_recompute = counts.send.recompute;
  r.recvs_recompute = counts.recv.recompute;
  r.sends_total = counts.send.forward + counts.send.recompute + counts.send.other;
  r.stats = *stats;
  r.grads = {x.grad(), expert.grad()};
  return r;
}

std::vector<ExchangeResult> runThreeRanks(CheckpointMode mode) {
  return runRanks<ExchangeResult>(3, [mode](int rank, const auto& store) { return runExchangeRank(rank, store, mode); });
}

TEST(Collectives, SelectiveServesTheAllToAllWithoutReissuingIt) {
  const auto off = runThreeRanks(CheckpointMode::kOff);
  const auto sel = runThreeRanks(CheckpointMode::kSelective);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(off[rank].sends_total, 2 * off[rank].expected_sends) << "rank " << rank << ": forward + backward";
    EXPECT_EQ(sel[rank].sends_forward, sel[rank].expected_sends) << "rank " << rank;
    EXPECT_EQ(sel[rank].recvs_forward, sel[rank].expected_sends) << "rank " << rank;
    EXPECT_EQ(sel[rank].sends_recompute, 0) << "rank " << rank << ": the recompute re-sent";
    EXPECT_EQ(sel[rank].recvs_recompute, 0) << "rank " << rank << ": the recompute received again";
    EXPECT_GE(sel[rank].stats.served, sel[rank].sends_forward + sel[rank].recvs_forward) << "rank " << rank;
    EXPECT_TRUE(Matches(sel[rank].grads, off[rank].grads)) << "rank " << rank;
  }
}

TEST(Collectives, FullReissuesTheAllToAllSymmetrically) {
  const auto off = runThreeRanks(CheckpointMode::kOff);
  const auto full = runThreeRanks(CheckpointMode::kFull);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(full[rank].sends_forward, full[rank].expected_sends) << "rank " << rank;
    EXPECT_EQ(full[rank].sends_recompute, full[rank].sends_forward) << "rank " << rank;
    EXPECT_EQ(full[rank].recvs_recompute, full[rank].recvs_forward) << "rank " << rank;
    EXPECT_TRUE(Matches(full[rank].grads, off[rank].grads)) << "rank " << rank;
  }
}

}  // namespace
}  // namespace hpac
