// hpac/tools/distributed/counting_group.h
//
// A Gloo process group that counts its collectives per checkpoint phase
// (forward region, recompute region, elsewhere): the evidence hpac-train and
// the multi-rank tests print for "communication saved in forward, never
// re-issued in the recompute".
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <cstdint>
#include <vector>

namespace hpac {
namespace dist {

// Process-group calls counted by the checkpoint region active on the calling
// thread: inside a forward region, inside a recompute region, elsewhere.
struct PhaseCounts {
  std::atomic<int64_t> forward{0}, recompute{0}, other{0};
  void reset() { forward = recompute = other = 0; }
  int64_t total() const { return forward + recompute + other; }
  void count();
};
struct CollectiveCounts {
  PhaseCounts allreduce, allgather, send, recv;
  void reset() {
    allreduce.reset();
    allgather.reset();
    send.reset();
    recv.reset();
  }
};

// ProcessGroupGloo that counts its allreduce / allgather / send / recv calls
// into `counts` (which must outlive it). Build one with countingGlooGroup().
class CountingGloo final : public c10d::ProcessGroupGloo {
 public:
  CountingGloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, c10::intrusive_ptr<Options> options,
               CollectiveCounts* counts)
      : ProcessGroupGloo(store, rank, size, std::move(options)), counts_(counts) {}
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

 private:
  CollectiveCounts* counts_;
};

// A process group of `size` ranks over `store` whose Gloo backend is a
// CountingGloo. On torch 1.13 the CountingGloo is the group itself; on 2.x a
// Gloo backend is not a ProcessGroup, so it is set as the CPU backend of one.
c10::intrusive_ptr<c10d::ProcessGroup> countingGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size,
                                                         const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options,
                                                         CollectiveCounts* counts);

}  // namespace dist
}  // namespace hpac
