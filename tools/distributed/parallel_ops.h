// hpac/tools/distributed/parallel_ops.h
//
// The parallel building blocks of the C++ multi-rank path: tensor-parallel
// copy/reduce, data-parallel gradient averaging, the expert-parallel
// all-to-all, FSDP-style parameter gathering. Every collective goes through the
// dispatcher (c10d::allreduce_, allgather_, send, recv_), so that hpac sees it
// inside checkpoint regions.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <vector>

namespace hpac {
namespace dist {

// Reduces `t` over `pg` in place (sum unless `op` says otherwise) through the
// dispatcher-routed c10d::allreduce_, and waits for it.
void allReduceInPlace(const at::Tensor& t, const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                      c10d::ReduceOp op = c10d::ReduceOp::SUM);

// Tensor parallelism (Megatron style). Collectives are dispatcher-routed
// c10d::allreduce_ calls on `pg`.
//  copyToTensorParallel:     forward identity, backward all-reduce of the gradient
//  reduceFromTensorParallel: forward all-reduce (sum of partial results), backward identity
at::Tensor copyToTensorParallel(const at::Tensor& x, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);
at::Tensor reduceFromTensorParallel(const at::Tensor& x, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

// Data parallelism: sums every defined gradient over `pg` and divides by its size.
void allReduceGradients(const std::vector<at::Tensor>& params, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

// Expert parallelism: the all-to-all token exchange, differentiable. The rows
// of `x` [N, ...] go out in order: the first send_counts[0] to rank 0 of `pg`,
// the next send_counts[1] to rank 1, ...; the result holds recv_counts[0] rows
// from rank 0, then recv_counts[1] from rank 1, ... Backward sends the
// gradient rows back the same way. libtorch 1.13's Gloo has neither the list
// alltoall nor a dispatcher-routed alltoall_base, so the exchange is built
// from the dispatcher-routed point-to-point ops c10d::send / c10d::recv_
// (every send posted before any receive is waited: no ordering deadlock);
// hpac sees each one, and the selective policy saves both sides (Note
// [Served Work handles] in replay/collective_work.cpp).
at::Tensor allToAll(const at::Tensor& x, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& recv_counts, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

// Exchanges a count table: row r of `counts` (int64 [size, k]) goes to rank
// r; row r of the result is what rank r sent to this one. Not differentiable.
at::Tensor exchangeCounts(const at::Tensor& counts, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

// FSDP-style parameter sharding: `local` is this rank's 1/size flat slice of a
// weight of `shape`. The full weight is all-gathered (c10d::allgather_
// through the dispatcher) every time this is called — in a layer's forward
// and again in its recompute — and lives only as long as its users. Backward
// sums the full gradient over `pg` and returns this rank's slice divided by
// the group size (the data-parallel mean).
at::Tensor fsdpGather(const at::Tensor& local, const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                      const std::vector<int64_t>& shape);

// The collectives through the dispatcher (c10d::allreduce_, allgather_, send,
// recv_), so that hpac sees them inside regions: c10d::ops::* on torch 1.13,
// the ProcessGroup's own methods on 2.x (which dispatch there).
c10::intrusive_ptr<c10d::Work> allReduce(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                         std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = {});
c10::intrusive_ptr<c10d::Work> allGather(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                         std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs);
c10::intrusive_ptr<c10d::Work> send(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::vector<at::Tensor>& tensors,
                                    int dst, int tag);
c10::intrusive_ptr<c10d::Work> recv(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::vector<at::Tensor>& tensors,
                                    int src, int tag);

}  // namespace dist
}  // namespace hpac
