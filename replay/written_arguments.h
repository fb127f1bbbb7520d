// hpac/replay/written_arguments.h
//
// Which arguments an op writes, and which of them each of its returns is:
// read off the schema's alias annotations, with c10d's unannotated in-place
// collectives added (Note [In-place collectives], replay/collective_work.cpp).
// keep() snapshots the written arguments and serve() copies the snapshots
// back; a return that aliases a written argument is served as the
// recompute's own argument; the budget profile and explain count such a
// return as the snapshot keep() would take.
#pragma once

#include <ATen/core/function_schema.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hpac {

// One flag per argument of `schema`: whether the op writes it.
std::vector<bool> writtenArguments(const c10::FunctionSchema& schema);

// Index of the argument a mutable return aliases (`Tensor(a!) self` ->
// `Tensor(a!)`), or -1 for a fresh return. A view's return (`Tensor(a)`, no
// write) is not one: it is kept and served as an alias of its own storage —
// serving a view its input would hand autograd the input itself as the view.
int64_t aliasedArgument(const c10::FunctionSchema& schema, size_t return_index);

}  // namespace hpac
