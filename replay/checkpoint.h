// hpac/replay/checkpoint.h
//
// hpac::checkpoint — activation checkpointing for C++ callables, non-reentrant
// by default (libtorch has none), selective when given a policy.
//
//   auto out = hpac::checkpoint(
//       [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{block->forward(in[0])}; },
//       {x}, {.policy = hpac::selectivePolicy()});
//
// Non-reentrant (default): the forward runs with grad enabled inside a
// checkpoint region; every tensor autograd saves is replaced by a placeholder
// (C++ saved-tensor hooks, see Note [Saved-tensor hooks from C++]). The first
// placeholder unpacked in backward re-runs the region in the recompute phase
// with the forward's RNG state; with a policy, saved ops are served from the
// forward's storage instead of running. Works with backward() and
// torch::autograd::grad, inputs that do not require grad, code that is not
// checkpointed around it, and backward on another thread. Recomputed tensors
// are released as autograd consumes them.
//
// Under no-grad (evaluation) the region is not entered: fn runs plainly and
// nothing is cached.
//
// Reentrant (options.use_reentrant): the forward runs under no-grad inside an
// autograd Function whose backward re-runs fn and differentiates it. Every
// tensor fn reads that needs a gradient and is not an input (module
// parameters) must be listed in options.parameters. Policies are not
// supported on this path (it recomputes everything).
//
// Regions do not nest: a checkpoint called inside a checkpointed function
// throws c10::Error.
#pragma once

#include "policy/checkpoint_policy.h"
#include "replay/invocation.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace hpac {

using CheckpointFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct CheckpointOptions {
  // Empty: full checkpoint (every op recomputed). Else selective.
  PolicyFactory policy;
  bool use_reentrant = false;
  // Restore the forward's CPU/CUDA RNG state for the recompute.
  bool preserve_rng_state = true;
  // Compare count, shape, dtype and device of the tensors autograd saved in
  // forward with those the recompute produced.
  bool determinism_check = true;
  // See InvocationOptions::allow_cache_mutation.
  bool allow_cache_mutation = false;
  // See InvocationOptions: routing ops (Note [Routing is verified]), writes to outside tensors in the recompute
  // (Note [State written twice]), the saved-tensor hooks around the region (Note [Outer saved-tensor hooks]).
  RoutingRule routing = RoutingRule::kVerify;
  StateWriteRule state_writes = StateWriteRule::kWarn;
  bool respect_saved_tensors_hooks = true;
  // Saved tensors that need no recompute (the policy keeps them, or the region did not make them) are held by the
  // frame; when every one is, backward does not re-run fn (Note [Frames hold what needs no recompute]). False: a
  // placeholder for each, and every backward re-runs fn (to measure the recompute itself).
  bool hold_saved = true;
  // The recompute stops once it has every saved tensor the frame does not hold (Note [The recompute stops early],
  // replay/checkpoint.cpp). False: it runs fn to the end, as before (torch's set_checkpoint_early_stop(False)).
  bool early_stop = true;
  // Reentrant path only: tensors fn uses that need gradients besides inputs.
  std::vector<at::Tensor> parameters;
  // If set, receives the stats of this checkpoint's invocation when the last
  // placeholder is released (after backward, or when the graph is dropped).
  std::shared_ptr<InvocationStats> stats_out;
  // Explain (replay/explain.h): records every op of this checkpoint's
  // invocation, forward and recompute. Non-reentrant path only.
  std::shared_ptr<DecisionRecorder> explain;
};

std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

// Single tensor in, single tensor out.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

// Installs hpac's chaining autograd engine (idempotent; done by checkpoint()
// on first use). Exposed for tests and for processes that swap engines.
void installCheckpointEngine();

}  // namespace hpac
