// hpac/tools/dist/dist.h
//
// Distributed composition on c10d (Gloo on CPU): rendezvous from the
// environment hpac-launch sets, a config consistency check across ranks, and
// tensor-parallel building blocks whose collectives go through the dispatcher
// (c10d::ops::*), so that hpac sees them inside checkpoint regions.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace hpac {
namespace dist {

// The rendezvous environment (set by hpac-launch): HPAC_RANK, HPAC_WORLD_SIZE,
// HPAC_MASTER_ADDR, HPAC_MASTER_PORT, optional HPAC_DIST_TIMEOUT_S (default 60).
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::chrono::milliseconds timeout{60000};
};

// Reads and validates the environment; throws c10::Error naming the variable,
// its value and what is allowed.
DistEnv readDistEnv();

// A TCPStore on master_addr:master_port (rank 0 serves it).
c10::intrusive_ptr<c10d::Store> connectStore(const DistEnv& env);

// Gloo options over loopback (or master_addr) with the environment's timeout.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> glooOptions(const DistEnv& env);

// Every rank publishes `summary` (one "key=value" per line); all ranks compare
// with rank 0's. Throws c10::Error naming the ranks and the differing lines.
void checkSameConfig(c10d::Store& store, int rank, int world_size, const std::string& summary);

// Tensor parallelism (Megatron style). Collectives are dispatcher-routed
// c10d::allreduce_ calls on `pg`.
//  copyToTensorParallel:     forward identity, backward all-reduce of the gradient
//  reduceFromTensorParallel: forward all-reduce (sum of partial results), backward identity
at::Tensor copyToTensorParallel(const at::Tensor& x, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);
at::Tensor reduceFromTensorParallel(const at::Tensor& x, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

// Data parallelism: sums every defined gradient over `pg` and divides by its size.
void allReduceGradients(const std::vector<at::Tensor>& params, const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

}  // namespace dist
}  // namespace hpac
