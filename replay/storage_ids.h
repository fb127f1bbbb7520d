// hpac/replay/storage_ids.h
//
// StorageIds: names the storages seen during one phase of an invocation, so
// that outputs sharing a storage (a view and its base, an in-place result and
// its argument) get one name. Used by the budget profile and by explain's
// byte accounting (Note [Profile storage ids] in replay/op_profile.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace hpac {

class StorageIds {
 public:
  // The id of t's storage (t defined, with storage); a storage not seen
  // before, or whose earlier holder expired, gets a new one (`*first` true).
  int64_t of(const at::Tensor& t, bool* first = nullptr) {
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    auto it = ids_.find(impl);
    const bool is_new = it == ids_.end() || it->second.first.expired();
    if (is_new) {
      c10::weak_intrusive_ptr<c10::StorageImpl> weak(t.storage().getWeakStorageImpl());
      it = ids_.insert_or_assign(impl, std::make_pair(std::move(weak), next_++)).first;
    }
    if (first != nullptr) *first = is_new;
    return it->second.second;
  }
  // The id of t's storage if it was named and its holder is alive, else -1;
  // names nothing.
  int64_t find(const at::Tensor& t) const {
    if (!t.defined() || !t.has_storage()) return -1;
    const auto it = ids_.find(t.storage().unsafeGetStorageImpl());
    return it == ids_.end() || it->second.first.expired() ? -1 : it->second.second;
  }
  // An id no storage has: for snapshots (copies keep() would make).
  int64_t fresh() { return next_++; }
  bool empty() const { return ids_.empty(); }
  // Forgets the storages (ids keep counting up).
  void clear() {
    ids_.clear();
    reported_.clear();
  }
  // The ids of the named storages freed since the last call (each reported once).
  std::vector<int64_t> takeFreed() {
    std::vector<int64_t> out;
    for (const auto& [impl, entry] : ids_) {
      if (entry.first.expired() && reported_.insert(entry.second).second) out.push_back(entry.second);
    }
    return out;
  }

 private:
  // Weak references keep the StorageImpl objects (not their data) allocated,
  // so an address seen here cannot be reused by a later storage.
  std::unordered_map<const c10::StorageImpl*, std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, int64_t>> ids_;
  std::unordered_set<int64_t> reported_;  // freed ids takeFreed() returned
  int64_t next_ = 0;
};

}  // namespace hpac
