// hpac/tools/trainer/parallel.h
//
// The Qwen3-MoE replica split over ranks (config `parallel:`; docs/distributed.md).
//
//   rank = dp_rank * tp + tp_rank          (tensor parallel innermost)
//   TP group:        the tp ranks of one dp_rank: attention heads (q and kv)
//                    and every expert's intermediate size are split between
//                    them (Megatron column/row parallel; the row-parallel
//                    outputs are all-reduced in forward)
//   DP group:        the dp ranks of one tp_rank: each its own micro-batch,
//                    gradients averaged after backward; with fsdp the
//                    attention projections live as 1/dp flat shards and are
//                    all-gathered in every forward and recompute
//   EP group:        ep consecutive dp ranks of one tp_rank: each owns
//                    num_experts/ep experts and the tokens routed to them
//                    travel all-to-all (dispatch and combine)
//   expert-DP group: the dp ranks owning the same experts (dp/ep of them):
//                    expert gradients are averaged over it
//
// Every collective goes through the dispatcher (c10d::ops::*), so hpac sees,
// saves and serves it inside checkpoint regions. Parameters keep the names of
// the 1-rank model; a rank holds its slice of each (shardRule), and its
// experts are renumbered locally (experts.0 is global expert
// ep_rank * num_experts / ep).
#pragma once

#include "tools/distributed/counting_group.h"
#include "tools/trainer/config.h"

#include "absl/status/statusor.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

namespace hpac::trainer {

class Qwen3MoeForCausalLM;

struct ParallelRuntime {
  ParallelSpec spec;
  ModelSpec model;
  int rank = 0, world = 1, tp_rank = 0, dp_rank = 0, ep_rank = 0;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> world_pg, tp_pg, dp_pg, ep_pg, expert_dp_pg;
  dist::CollectiveCounts counts;  // the calls of every group above

  int64_t localExperts() const { return model.num_experts / spec.ep; }
  int64_t firstExpert() const { return ep_rank * localExperts(); }
};

// Joins the job hpac-launch (or hpac-train --nproc) started: reads HPAC_RANK,
// HPAC_WORLD_SIZE, HPAC_MASTER_ADDR/PORT, checks the world size equals
// tp x dp, builds the groups, then has every rank compare `summary` (its
// effective config, one "key=value" per line) with rank 0's: a rank running
// another mode or plan fails the job naming the ranks and the lines.
absl::StatusOr<std::shared_ptr<ParallelRuntime>> connectParallel(const TrainConfig& config,
                                                                 const std::string& summary);

// How a rank's parameter relates to the 1-rank model: the full model's
// parameter name, and the slice of that tensor (or of its gradient) the
// rank holds.
struct ShardRule {
  std::string full_name;
  std::function<at::Tensor(const at::Tensor&)> slice;
};
ShardRule shardRule(const std::string& local_name, const ParallelRuntime& rt);

// Splits a freshly initialised model (identical on every rank) over the
// layout: keeps this rank's experts, replaces every parameter by its slice,
// and makes the attention and MoE blocks run their parallel forward.
void shardQwen3Moe(Qwen3MoeForCausalLM& model, const std::shared_ptr<ParallelRuntime>& rt);

// After backward: sums the tensor-parallel partial gradients (q_norm, k_norm:
// each TP rank sees only its heads), averages the replicated parameters over
// DP and the experts over expert-DP (fsdp shards are averaged by their own
// backward).
void synchronizeGradients(Qwen3MoeForCausalLM& model, const ParallelRuntime& rt);

// Sum of a scalar over `pg` (outside any region); max when `max` is set.
double allReduceScalar(double value, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, bool max = false);

}  // namespace hpac::trainer
