// hpac/policy/traced_policy.h
//
// TracedPolicy: hpac's decisions for a checkpoint region that a compiler
// traces instead of running (torch.compile).
//
// Inside compiled code no op passes hpac's dispatch key: the region is traced
// once into a graph, the policy's answer for each traced op becomes that
// node's `recompute` tag, and the compiler's partitioner saves or recomputes
// (Note [hpac under torch.compile] in docs/design.md). TracedPolicy asks the
// same Policy the eager Invocation asks, with the same rules around it:
//  - ops of the ignored table are not counted and not asked about (answer
//    PREFER_RECOMPUTE: the compiler decides, as for any op outside a policy);
//  - every other op is counted per operator within this region, from 0 (the
//    occurrence the policy sees), and the policy decides in the forward phase;
//  - an op whose result aliases its input is never saved (Note [Views are
//    recomputed], replay/invocation.cpp): a save becomes MUST_RECOMPUTE.
// One TracedPolicy serves one traced region (one checkpoint call), used by one
// thread. It keeps no tensors.
#pragma once

#include "policy/checkpoint_policy.h"
#include "policy/op_tables.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace hpac {

class TracedPolicy {
 public:
  // An empty factory is the full checkpoint (every op PREFER_RECOMPUTE). Throws
  // c10::Error if the factory makes no policy, or if the policy profiles
  // (a memory budget: its plan is made from an eager profile, which a traced
  // region never runs).
  // save_routing: routing ops (ResolvedOpTables::isRouting) are MUST_SAVE whatever the policy says, as
  // RoutingRule::kSave makes them in eager replay (Note [Routing is verified], replay/routing_check.h).
  // record_log: keep log() (tests and tools that show what the policy saw); off, nothing grows per traced op.
  explicit TracedPolicy(const PolicyFactory& factory, bool save_routing = false, bool record_log = false);

  // The answer for the next call of `op` in the traced forward.
  CheckpointPolicy decide(const c10::OperatorHandle& op);
  // The answer for something that is not a registered operator (a
  // higher-order operator of the tracer): not counted, PREFER_RECOMPUTE.
  CheckpointPolicy decideUnregistered(const std::string& name);

  uint64_t id() const { return id_; }
  int64_t counted() const { return counted_; }
  int64_t ignored() const { return ignored_; }
  int64_t saved() const { return saved_; }
  // With record_log, one line per op asked about: "<op> <answer>" (answers as in toString(CheckpointPolicy)),
  // "<op> ignored", "<name> unregistered"; empty otherwise.
  const std::vector<std::string>& log() const { return log_; }

 private:
  const ResolvedOpTables& tables_;
  std::unique_ptr<Policy> policy_;
  uint64_t id_;
  bool save_routing_;
  bool record_log_;
  std::unordered_map<OpId, int64_t> occurrences_;
  int64_t counted_ = 0;
  int64_t ignored_ = 0;
  int64_t saved_ = 0;
  std::vector<std::string> log_;
};

}  // namespace hpac
