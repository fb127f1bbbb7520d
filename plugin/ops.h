// hpac/plugin/ops.h
//
// The `hpac` operator namespace and custom classes, the interface Python (and
// any TorchScript or C++ caller going through the dispatcher) uses:
//
//   torch.ops.hpac.version() -> str           torch.ops.hpac.library_path() -> str
//   torch.ops.hpac.built_for_torch() -> str   (the torch version libhpac was compiled against)
//   torch.ops.hpac.dispatch_key() -> str      torch.ops.hpac.fallback_status() -> str
//   torch.ops.hpac.global_stats() -> Dict[str, int]
//   torch.ops.hpac.reset_global_stats() -> None
//   torch.ops.hpac.fallback_entries() -> int  (this thread)
//   torch.ops.hpac.track_memory() -> None, memory_stats() -> Dict[str, int]
//       {current_bytes, peak_bytes, allocations}, reset_peak_memory() -> None
//   torch.classes.hpac.Invocation(kind: str, save_list: List[str], allow_cache_mutation: bool)
//       kind: "selective" (built-in policy), "full" (recompute everything), "save_list"
//       .id() -> int, .enter(phase: "forward"|"recompute"), .exit(completed: bool), .stats() -> Dict[str, int],
//       .stored_entries() -> int, .record_ops(on: bool), .op_log() -> List[str],
//       .watches_saved() -> bool (note_saved wants this forward's saved tensors: a budget profile, or a
//       plan that skips ops), .note_saved(Tensor) (autograd saved it)
//       ("forward aten::mm saved", "recompute aten::mm served", ...: every op handed to the invocation)
//   torch.classes.hpac.BudgetRegion(fraction: Optional[float], bytes: Optional[int], profile_invocations: int,
//                                   max_replans: int, skip_dead: bool, plan_text: Optional[str], plan_source: str)
//       the budget policy's region (policy/budget_policy.h); with plan_text, one replaying that plan
//       (Note [Plan files]; fraction and bytes None)
//       .plan_text() -> str (throws unless planned), .plan_source() -> str ("" unless loaded)
//       .invocation(allow_cache_mutation: bool) -> Invocation   a checkpoint call planned by this region
//       .stage() -> str ("profiling", "planned", "fallback (fixed selective policy)"),
//       .status() -> Dict[str, int] {profiles, replans, profiled_ops, budget_bytes, kept_bytes, total_bytes, off_bytes,
//                                    groups,
//                                    kept_groups, planned_ops, saved_ops},
//       .micros() -> List[float] [kernel µs the plan saves from the recompute, kernel µs of every profiled op]
#pragma once

#include <torch/library.h>

namespace hpac {

void registerHpacOps(torch::Library& m);

}  // namespace hpac
