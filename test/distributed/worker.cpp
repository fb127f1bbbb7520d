// hpac-dist-worker: one rank of a tensor-, expert- and data-parallel Qwen3-style
// block (attention with heads split across TP ranks, SwiGLU MLP split by its
// intermediate size, sparse MoE with top-k routing and in-place
// renormalisation whose experts are split over the same ranks; row-parallel
// outputs and the MoE combine all-reduced through c10d::allreduce_; gradients
// all-reduced over DP ranks), trained for a few steps under off,
// full and selective checkpointing. Every rank also computes the unsharded
// model on the whole batch locally — the 1-rank run — and compares loss and
// gradients. Process-group calls are counted per phase: inside a forward
// region, inside a recompute region, elsewhere.
//
//   hpac-launch --nproc 2 -- hpac-dist-worker --tp 2 --dp 1
//
// Flags: --tp N --dp N (tp*dp = world size), --fsdp (MLP weights sharded over DP ranks, gathered in every
// forward and recompute), --steps N, --mode off|full|selective|all,
// --mode-rank1 M (rank 1 runs mode M: the consistency check must fail),
// --die-rank R (rank R exits abruptly in the middle of its second step's forward, right after an
// all-reduce: its peers are left waiting in the next collective), --profile (record_function
// ranges around each sublayer, in forward only, to show that profiler ops do not shift replay).
#include "policy/selective_policy.h"
#include "replay/checkpoint.h"
#include "replay/region.h"
#include "tools/distributed/counting_group.h"
#include "tools/distributed/parallel_ops.h"
#include "tools/distributed/rendezvous.h"
#include "tools/evidence/evidence.h"
#include "tools/moe/moe_router.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

namespace {

using hpac::CheckpointMode;

struct Flags {
  int tp = 1, dp = 1, steps = 3, die_rank = -1;
  std::string mode = "all", mode_rank1;
  bool profile = false, fsdp = false;
};

int positive(const std::string& flag, const char* v) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && x >= 1 && x <= 4096, "hpac-dist-worker: ", flag,
              " expects a positive integer, got '", v, "'");
  return static_cast<int>(x);
}

Flags parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--profile" || a == "--fsdp") {
      (a == "--profile" ? f.profile : f.fsdp) = true;
      continue;
    }
    TORCH_CHECK(i + 1 < argc, "hpac-dist-worker: ", a, " needs a value");
    const char* v = argv[++i];
    if (a == "--tp") f.tp = positive(a, v);
    else if (a == "--dp") f.dp = positive(a, v);
    else if (a == "--steps") f.steps = positive(a, v);
    else if (a == "--mode") f.mode = v;
    else if (a == "--mode-rank1") f.mode_rank1 = v;
    else if (a == "--die-rank") f.die_rank = std::atoi(v);
    else TORCH_CHECK(false, "hpac-dist-worker: unknown flag '", a, "'");
  }
  if (f.mode != "all") hpac::checkpointModeOrThrow(f.mode);
  if (!f.mode_rank1.empty()) hpac::checkpointModeOrThrow(f.mode_rank1);
  return f;
}

constexpr int64_t kHidden = 32, kHeads = 4, kInter = 64, kSeq = 8, kBatchPerDp = 2;
constexpr int64_t kExperts = 4, kExpertInter = 16, kTopK = 2;

// Full (unsharded) parameters, identical on every rank.
struct FullParams {
  at::Tensor wq, wk, wv, wo, wg, wu, wd;
  FullParams() {
    at::manual_seed(1234);
    auto p = [](int64_t o, int64_t i) { return (at::randn({o, i}) / std::sqrt(static_cast<double>(i))).set_requires_grad(true); };
    wq = p(kHidden, kHidden);
    wk = p(kHidden, kHidden);
    wv = p(kHidden, kHidden);
    wo = p(kHidden, kHidden);
    wg = p(kInter, kHidden);
    wu = p(kInter, kHidden);
    wd = p(kHidden, kInter);
    gate = p(kExperts, kHidden);
    for (int64_t e = 0; e < kExperts; ++e) {
      up.push_back(p(kExpertInter, kHidden));
      down.push_back(p(kHidden, kExpertInter));
    }
  }
  at::Tensor gate;
  std::vector<at::Tensor> up, down;
  // Dense weights, then the router gate, then (up, down) of every expert.
  std::vector<at::Tensor> list() const {
    std::vector<at::Tensor> l{wq, wk, wv, wo, wg, wu, wd, gate};
    for (int64_t e = 0; e < kExperts; ++e) l.insert(l.end(), {up[e], down[e]});
    return l;
  }
};

// This TP rank's shards: rows of q/k/v/gate/up (its heads, its slice of the
// intermediate size), columns of o/down.
struct Shard {
  at::Tensor wq, wk, wv, wo, wg, wu, wd;
  Shard(const FullParams& f, int tp_rank, int tp) {
    const int64_t h = kHidden / tp, i = kInter / tp;
    auto rows = [](const at::Tensor& w, int64_t n, int r) { return w.detach().narrow(0, r * n, n).clone().set_requires_grad(true); };
    auto cols = [](const at::Tensor& w, int64_t n, int r) { return w.detach().narrow(1, r * n, n).clone().set_requires_grad(true); };
    wq = rows(f.wq, h, tp_rank);
    wk = rows(f.wk, h, tp_rank);
    wv = rows(f.wv, h, tp_rank);
    wo = cols(f.wo, h, tp_rank);
    wg = rows(f.wg, i, tp_rank);
    wu = rows(f.wu, i, tp_rank);
    wd = cols(f.wd, i, tp_rank);
    // Expert parallelism over the TP ranks: the router is replicated, expert e
    // lives on rank e % tp.
    auto copy = [](const at::Tensor& w) { return w.detach().clone().set_requires_grad(true); };
    gate = copy(f.gate);
    for (int64_t e = tp_rank; e < kExperts; e += tp) {
      up.push_back(copy(f.up[e]));
      down.push_back(copy(f.down[e]));
    }
  }
  at::Tensor gate;
  std::vector<at::Tensor> up, down;  // local experts only
  std::vector<at::Tensor> list() const {
    std::vector<at::Tensor> l{wq, wk, wv, wo, wg, wu, wd, gate};
    for (size_t j = 0; j < up.size(); ++j) l.insert(l.end(), {up[j], down[j]});
    return l;
  }
};

// Set on the --die-rank rank for its second step.
bool g_die_mid_step = false;

at::Tensor rmsNorm(const at::Tensor& x) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
}

void recordFunction(bool enter, c10::IValue* handle, const char* name) {
  static auto enter_op = c10::Dispatcher::singleton().findSchemaOrThrow("profiler::_record_function_enter_new", "");
  static auto exit_op = c10::Dispatcher::singleton().findSchemaOrThrow("profiler::_record_function_exit", "_RecordFunction");
  torch::jit::Stack stack;
  if (enter) {
    stack = {c10::IValue(std::string(name)), c10::IValue()};
    enter_op.callBoxed(&stack);
    *handle = stack.back();
  } else {
    stack = {*handle};
    exit_op.callBoxed(&stack);
  }
}

// The block. `heads` is the number of heads this call computes (all of them
// unsharded, kHeads/tp when sharded); pg == nullptr means unsharded.
at::Tensor block(const at::Tensor& x, const std::vector<at::Tensor>& w, int64_t heads,
                 const c10::intrusive_ptr<c10d::ProcessGroup>& pg, bool profile) {
  const int64_t b = x.size(0), s = x.size(1), hd = kHidden / kHeads;
  auto in = [&](const at::Tensor& t) { return pg ? hpac::dist::copyToTensorParallel(t, pg) : t; };
  auto out = [&](const at::Tensor& t) { return pg ? hpac::dist::reduceFromTensorParallel(t, pg) : t; };
  c10::IValue range;
  if (profile) recordFunction(true, &range, "attention");
  const at::Tensor a_in = in(rmsNorm(x));
  auto split = [&](const at::Tensor& wt) { return at::linear(a_in, wt).view({b, s, heads, hd}).transpose(1, 2); };
  const at::Tensor q = split(w[0]), k = split(w[1]), v = split(w[2]);
  const at::Tensor causal = at::ones({s, s}, x.options().dtype(at::kBool)).triu(1);
  const at::Tensor probs = at::softmax(at::matmul(q, k.transpose(-2, -1)).div(std::sqrt(double(hd))).masked_fill(causal, -INFINITY), -1);
  const at::Tensor ctx = at::matmul(probs, v).transpose(1, 2).reshape({b, s, heads * hd});
  const at::Tensor h1 = x + out(at::linear(ctx, w[3]));
  if (g_die_mid_step) {  // fault injection: after this rank's first all-reduce of the step, inside the forward
    std::cout << "rank exits abruptly in the middle of step 2's forward (fault injection)" << std::endl;
    std::_Exit(3);
  }
  if (profile) recordFunction(false, &range, "attention");
  const at::Tensor m_in = in(rmsNorm(h1));
  const at::Tensor h2 = h1 + out(at::linear(at::silu(at::linear(m_in, w[4])) * at::linear(m_in, w[5]), w[6]));
  // Sparse MoE, experts split over the same ranks (EP = TP group). Activations
  // are replicated across them, so dispatch is a local selection; combine sums
  // the ranks' partial outputs with one all-reduce. The router's input passes
  // copyToTensorParallel too: each rank's router gradient covers only its own
  // experts' tokens, and the backward all-reduce sums the parts.
  const int64_t ep = pg ? pg->getSize() : 1, ep_rank = pg ? pg->getRank() : 0;
  const at::Tensor e_in = in(rmsNorm(h2)).reshape({-1, kHidden});
  const hpac::TopKRouting routing = hpac::routeTopK(at::linear(e_in, w[7]), kTopK, /*renormalize=*/true, at::kFloat);
  at::Tensor partial = at::zeros_like(e_in);
  for (int64_t j = 0, e = ep_rank; e < kExperts; ++j, e += ep) {
    const hpac::ExpertTokens hit = hpac::tokensFor(routing, e);
    if (hit.empty()) continue;
    const at::Tensor y = at::linear(at::silu(at::linear(e_in.index_select(0, hit.token), w[8 + 2 * j])), w[9 + 2 * j]);
    partial.index_add_(0, hit.token, y * hit.weight);
  }
  return h2 + out(partial).view(h2.sizes());
}

}  // namespace

int main(int argc, char** argv) try {
  const Flags flags = parseFlags(argc, argv);
  const hpac::dist::DistEnv env = hpac::dist::readDistEnv();
  TORCH_CHECK(flags.tp * flags.dp == env.world_size, "hpac-dist-worker: tp (", flags.tp, ") x dp (", flags.dp,
              ") must equal the world size (", env.world_size, ")");
  TORCH_CHECK(kHeads % flags.tp == 0 && kInter % flags.tp == 0 && kExperts % flags.tp == 0, "hpac-dist-worker: tp (",
              flags.tp, ") must divide the heads (", kHeads, "), the intermediate size (", kInter,
              ") and the experts (", kExperts, ")");
  const int tp_rank = env.rank % flags.tp, dp_rank = env.rank / flags.tp;
  auto store = hpac::dist::connectStore(env);

  std::vector<std::string> modes;
  if (flags.mode == "all") modes = {"off", "full", "selective"};
  else modes = {flags.mode};
  if (env.rank == 1 && !flags.mode_rank1.empty()) modes = {flags.mode_rank1};
  std::ostringstream summary;
  summary << "activation_checkpoint.modes=";
  for (const auto& m : modes) summary << m << ",";
  summary << "\nparallel.tp=" << flags.tp << "\nparallel.dp=" << flags.dp << "\nparallel.fsdp=" << flags.fsdp
          << "\nsteps=" << flags.steps;
  hpac::dist::checkSameConfig(*store, env.rank, env.world_size, summary.str());

  hpac::dist::CollectiveCounts tp_counts, dp_counts;
  hpac::dist::PhaseCounts& calls = tp_counts.allreduce;
  hpac::dist::PhaseCounts& gathers = dp_counts.allgather;
  auto options = hpac::dist::glooOptions(env);
  auto tp_store = c10::make_intrusive<c10d::PrefixStore>("tp" + std::to_string(dp_rank), store);
  auto dp_store = c10::make_intrusive<c10d::PrefixStore>("dp" + std::to_string(tp_rank), store);
  c10::intrusive_ptr<c10d::ProcessGroup> tp_pg =
      hpac::dist::countingGlooGroup(tp_store, tp_rank, flags.tp, options, &tp_counts);
  c10::intrusive_ptr<c10d::ProcessGroup> dp_pg =
      hpac::dist::countingGlooGroup(dp_store, dp_rank, flags.dp, options, &dp_counts);

  const FullParams full;
  const c10::intrusive_ptr<c10d::ProcessGroup> unsharded;
  at::manual_seed(99);
  const at::Tensor data = at::randn({kBatchPerDp * flags.dp, kSeq, kHidden});
  bool ok = true;
  for (const std::string& mode_name : modes) {
    const CheckpointMode mode = hpac::checkpointModeOrThrow(mode_name);
    const Shard shard(full, tp_rank, flags.tp);
    // FSDP: the MLP weights (w[4..6]) live as 1/dp flat slices per DP rank.
    std::vector<at::Tensor> fsdp_local;
    if (flags.fsdp) {
      for (const at::Tensor& w : {shard.wg, shard.wu, shard.wd}) {
        const int64_t n = w.numel() / flags.dp;
        fsdp_local.push_back(w.detach().reshape({-1}).narrow(0, dp_rank * n, n).clone().set_requires_grad(true));
      }
    }
    auto weights = [&] {
      std::vector<at::Tensor> w = shard.list();
      if (flags.fsdp) {
        const at::Tensor* full_shapes[] = {&shard.wg, &shard.wu, &shard.wd};
        for (int k = 0; k < 3; ++k) {
          w[4 + k] = hpac::dist::fsdpGather(fsdp_local[k], dp_pg, full_shapes[k]->sizes().vec());
        }
      }
      return w;
    };
    std::map<std::string, double> worst;
    std::map<std::string, std::string> where;  // the worst gradient difference's tensor and index
    for (int step = 0; step < flags.steps; ++step) {
      g_die_mid_step = env.rank == flags.die_rank && step == 1;
      tp_counts.reset();
      dp_counts.reset();
      // Sharded: this DP rank's micro-batch, the mean loss over DP ranks.
      for (const auto& p : shard.list()) p.mutable_grad().reset();
      for (const auto& p : fsdp_local) p.mutable_grad().reset();
      const at::Tensor xs = data.narrow(0, dp_rank * kBatchPerDp, kBatchPerDp).clone().set_requires_grad(true);
      auto fn = [&](const at::Tensor& in) { return block(in, weights(), kHeads / flags.tp, tp_pg, flags.profile); };
      std::shared_ptr<hpac::InvocationStats> region_stats;
      at::Tensor y;
      if (mode == CheckpointMode::kOff) {
        y = fn(xs);
      } else {
        hpac::CheckpointOptions o = hpac::checkpointOptionsFor(mode);
        o.stats_out = region_stats = std::make_shared<hpac::InvocationStats>();
        // The checks below count every op and collective of the recompute against the forward's: run it to the
        // end (Note [The recompute stops early]: stopped early, it would not re-issue the tail's all-reduce).
        o.early_stop = false;
        // record_function ranges only in the forward (as a profiler schedule would), never in the recompute
        bool first = true;
        y = hpac::checkpoint(
            [&](const at::Tensor& in) {
              const bool profile = flags.profile && first;
              first = false;
              return block(in, weights(), kHeads / flags.tp, tp_pg, profile);
            },
            xs, o);
      }
      const int forward_calls = calls.forward;
      const at::Tensor loss = y.pow(2).mean();
      loss.backward();
      // The replicated router's gradient is partial on each EP rank (its own experts' tokens): sum it.
      if (flags.tp > 1) hpac::dist::allReduceInPlace(shard.gate.grad(), tp_pg);
      hpac::dist::allReduceGradients(shard.list(), dp_pg);
      std::vector<at::Tensor> xs_grad{xs.grad().clone()};
      // The recompute must count exactly the forward's ops: with --profile the
      // forward alone ran record_function ranges, whose profiler ops must be
      // ignored (not counted, cached or served), or every later count shifts.
      if (region_stats && region_stats->ops_forward != region_stats->ops_recompute) {
        std::cout << "ERROR: mode " << mode_name << " step " << step << ": " << region_stats->ops_forward
                  << " ops counted in the forward, " << region_stats->ops_recompute
                  << " in the recompute (profiler ops counted?)" << std::endl;
        ok = false;
      }

      // The 1-rank run: unsharded weights, whole batch, mean over it.
      for (const auto& p : full.list()) p.mutable_grad().reset();
      const at::Tensor xf = data.clone().set_requires_grad(true);
      const at::Tensor loss_full = block(xf, full.list(), kHeads, unsharded, false).pow(2).mean();
      loss_full.backward();

      // Gradient of the sharded run's loss w.r.t. this rank's inputs equals
      // dp x the full run's (its loss is a mean over a 1/dp slice).
      const double loss_diff = hpac::scalarDiff(loss.item<double>(),
                                        block(xf.detach().narrow(0, dp_rank * kBatchPerDp, kBatchPerDp), full.list(), kHeads,
                                              unsharded, false).pow(2).mean().item<double>());
      const int64_t hs = kHidden / flags.tp, is = kInter / flags.tp;
      std::vector<at::Tensor> want = {
          full.wq.grad().narrow(0, tp_rank * hs, hs), full.wk.grad().narrow(0, tp_rank * hs, hs),
          full.wv.grad().narrow(0, tp_rank * hs, hs), full.wo.grad().narrow(1, tp_rank * hs, hs),
          full.wg.grad().narrow(0, tp_rank * is, is), full.wu.grad().narrow(0, tp_rank * is, is),
          full.wd.grad().narrow(1, tp_rank * is, is), full.gate.grad()};
      for (int64_t e = tp_rank; e < kExperts; e += flags.tp) {
        want.push_back(full.up[e].grad());
        want.push_back(full.down[e].grad());
      }
      std::vector<at::Tensor> got = shard.list();
      if (flags.fsdp) {  // compare this rank's FSDP slices with the matching slices of the full gradient
        for (int k = 0; k < 3; ++k) {
          const int64_t n = want[4 + k].numel() / flags.dp;
          want[4 + k] = want[4 + k].reshape({-1}).narrow(0, dp_rank * n, n);
          got[4 + k] = fsdp_local[k];
        }
      }
      std::vector<at::Tensor> got_grads;
      std::vector<std::string> names;
      for (size_t i = 0; i < want.size(); ++i) {
        TORCH_CHECK(got[i].grad().defined(), "hpac-dist-worker: no gradient for parameter ", i);
        got_grads.push_back(got[i].grad());
        names.push_back("parameter " + std::to_string(i));
      }
      const hpac::TensorDiff grads_vs = hpac::compareTensors(got_grads, want, names);
      const hpac::TensorDiff input_vs = hpac::compareTensors(
          {xs_grad[0]}, {xf.grad().narrow(0, dp_rank * kBatchPerDp, kBatchPerDp) * flags.dp}, {"input"});
      const double grad_diff = grads_vs.max_abs, input_diff = input_vs.max_abs;
      if (grad_diff > worst["grad"]) where["grad"] = "step " + std::to_string(step) + ": " + grads_vs.where;
      if (input_diff > worst["input_grad"]) where["input_grad"] = "step " + std::to_string(step) + ": " + input_vs.where;
      worst["loss"] = std::max(worst["loss"], loss_diff);
      worst["grad"] = std::max(worst["grad"], grad_diff);
      worst["input_grad"] = std::max(worst["input_grad"], input_diff);

      // Forward-region all-reduces: attention output, MLP output, MoE combine.
      const int expected_forward = mode == CheckpointMode::kOff ? 0 : (flags.tp > 1 ? 3 : 0);
      const int expected_recompute = mode == CheckpointMode::kFull ? expected_forward : 0;
      std::cout << "mode " << mode_name << " step " << step << ": allreduce calls forward-region " << forward_calls
                << ", recompute-region " << calls.recompute << ", outside regions " << calls.other << "; |dloss| "
                << loss_diff << ", max|dgrad| " << grad_diff << ", max|dinput_grad| " << input_diff << std::endl;
      if (flags.fsdp) {
        // FSDP re-gathers: once per sharded weight in the forward, and again in every recompute.
        const int want_fwd = mode == CheckpointMode::kOff ? 0 : 3, want_rec = want_fwd;
        std::cout << "mode " << mode_name << " step " << step << ": FSDP allgather calls forward-region "
                  << gathers.forward << ", recompute-region " << gathers.recompute << ", outside regions "
                  << gathers.other << std::endl;
        if (gathers.forward != want_fwd || gathers.recompute != want_rec) {
          std::cout << "ERROR: expected " << want_fwd << " FSDP gathers in the forward region and " << want_rec
                    << " in the recompute region" << std::endl;
          ok = false;
        }
      }
      if (forward_calls != expected_forward || calls.recompute != expected_recompute) {
        std::cout << "ERROR: expected forward-region " << expected_forward << " and recompute-region "
                  << expected_recompute << " allreduce calls" << std::endl;
        ok = false;
      }
    }
    // TP/DP change the order of floating-point sums: compare to the 1-rank run within fp32 tolerance.
    constexpr double kTol = 1e-5;
    const bool pass = worst["loss"] <= kTol && worst["grad"] <= kTol && worst["input_grad"] <= kTol;
    std::cout << "mode " << mode_name << ": " << (pass ? "PASS" : "FAIL") << " vs the 1-rank run (tolerance " << kTol
              << "): max|dloss| " << worst["loss"] << ", max|dgrad| " << worst["grad"] << ", max|dinput_grad| "
              << worst["input_grad"] << std::endl;
    for (const auto& [what, place] : where) {
      if (!pass) std::cout << "mode " << mode_name << ": worst " << what << " difference at " << place << std::endl;
    }
    ok = ok && pass;
  }
  return ok ? 0 : 1;
} catch (const c10::Error& e) {
  std::cerr << e.what_without_backtrace() << std::endl;
  return 1;
} catch (const std::exception& e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
