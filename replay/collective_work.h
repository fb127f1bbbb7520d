// hpac/replay/collective_work.h
//
// What the replay needs to know about c10d's dispatcher-routed collectives:
// which ops write their first argument without saying so in their schema
// (Note [In-place collectives]), and how their Work handles are waited and
// replaced by completed ones so that nobody waits one twice
// (Note [Served Work handles]). Only this file and its .cpp see c10d.
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <cstddef>

namespace hpac {

// c10d::allreduce_, alltoall_, allgather_, reduce_scatter_, broadcast_, recv_, ...:
// writes argument 0 in place and returns it (with a Work), unannotated.
bool isInPlaceCollective(const c10::FunctionSchema& schema);

// Whether `value` is a c10d Work handle.
bool isWork(const c10::IValue& value);

// A Work that is already complete: what the caller gets in place of a handle
// hpac has waited, and what a recompute is served.
c10::IValue completedWork();

// Waits every Work among the top `num_returns` values of `stack` and replaces
// each by completedWork().
void waitWorks(torch::jit::Stack* stack, size_t num_returns);

// _c10d_functional::all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
// ... (every op of that namespace but wait_tensor and _wrap_tensor_autograd): returns tensors that are
// final only once waited (Note [Functional collectives are waited before they
// are saved]).
bool isFunctionalCollective(const c10::FunctionSchema& schema);

// Waits the tensors among the top `num_returns` values of `stack` with
// _c10d_functional::wait_tensor. Call with hpac's key excluded.
void waitFunctionalOutputs(const torch::jit::Stack& stack, size_t num_returns);

}  // namespace hpac
