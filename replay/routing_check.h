// hpac/replay/routing_check.h
//
// RoutingCheck: the forward's routing decisions, kept so that the recompute
// can be checked against them (Note [Routing is verified]).
#pragma once

#include "policy/op_tables.h"
#include "replay/op_occurrence.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hpac {

// Note [Routing is verified]
// An MoE router's topk (DeepSeek-V3's group-limited topk, the histc / bincount
// of the chosen experts, the nonzero / sort that gather each expert's tokens)
// decides which experts run and on how many rows. A recompute whose router
// decides differently — a tie broken another way, bf16 logits that moved,
// a nondeterministic histc on GPU — runs the experts on other tokens: shapes
// change (the failures users reported: 18187 vs 18201 rows, 99 vs 98,
// repeat_interleave 30364 vs 30365), or, worse, they do not, and the gradients
// belong to another routing than the loss, mixed with the outputs saved in the
// forward. The reference policy recomputes topk (Qwen-style routers divide its
// values in place), so hpac keeps that rule and checks it: for every routing op
// (ResolvedOpTables::isRouting) the policy recomputes, the forward keeps a copy
// of its returns that carry the decision — the integer ones (topk's indices,
// nonzero, bincount, sort's permutation), or all of them for an op with no
// integer return (histc's counts) — and the recompute compares what it
// computed with them, bit for bit, right after the op ran: any difference
// stops backward with an error naming the op, the occurrence and the first
// differing element, before a single expert ran on other rows. The copies are
// small beside a layer's activations (topk of Qwen3-30B-A3B: 8 indices, 64
// bytes, per token, against 4 KiB of bf16 hidden state) and are released as
// they are compared. RoutingRule::kSave instead saves routing ops whatever the
// policy said (replay/recompute_rules.h): the recompute is then served the
// forward's decisions and cannot drift.
class RoutingCheck {
 public:
  // Forward, after a routing op the policy recomputes ran (its returns on top of `stack`).
  void keep(const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack);
  bool holds(const c10::OperatorHandle& op, int64_t occurrence) const {
    return !kept_.empty() && kept_.count(Key{opId(op), occurrence}) != 0;
  }
  // Recompute, after the op ran again: compares its returns with the forward's and releases them. Throws
  // c10::Error naming the op, the occurrence and the first difference.
  void verify(const c10::OperatorHandle& op, int64_t occurrence, uint64_t invocation, const torch::jit::Stack& stack);
  int64_t bytes() const { return bytes_; }
  void clear() {
    kept_.clear();
    bytes_ = 0;
  }

 private:
  using Key = OpOccurrence;
  using KeyHash = OpOccurrenceHash;
  std::unordered_map<Key, std::vector<std::pair<size_t, at::Tensor>>, KeyHash> kept_;  // (return index, copy)
  int64_t bytes_ = 0;
};

}  // namespace hpac
