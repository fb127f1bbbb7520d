#include "tools/distributed/counting_group.h"

#include "replay/region.h"
#include "replay/torch_compat.h"

namespace hpac {
namespace dist {

void PhaseCounts::count() {
  const RegionState& region = currentRegion();
  if (region.invocation == nullptr) {
    ++other;
  } else if (region.phase == Phase::kForward) {
    ++forward;
  } else {
    ++recompute;
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> countingGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size,
                                                         const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options,
                                                         CollectiveCounts* counts) {
  auto gloo = c10::make_intrusive<CountingGloo>(store, rank, size, options, counts);
#if HPAC_TORCH_AT_LEAST(2, 0)
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return pg;
#else
  return gloo;
#endif
}

c10::intrusive_ptr<c10d::Work> CountingGloo::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  counts_->allreduce.count();
  return ProcessGroupGloo::allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGloo::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  counts_->allgather.count();
  return ProcessGroupGloo::allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGloo::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  counts_->send.count();
  return ProcessGroupGloo::send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> CountingGloo::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  counts_->recv.count();
  return ProcessGroupGloo::recv(tensors, src, tag);
}

}  // namespace dist
}  // namespace hpac
