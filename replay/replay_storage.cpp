#include "replay/replay_storage.h"

#include "policy/op_tables.h"
#include "replay/collective_work.h"
#include "replay/dispatch_key.h"
#include "replay/for_each_tensor.h"
#include "replay/written_arguments.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <string>

namespace hpac {
namespace {

int64_t tensorBytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

}  // namespace

at::Tensor detachedAlias(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), /*allow_tensor_metadata_change=*/true));
}

// Forward, SAVE. Arguments the op writes (in-place and out= ops, collectives)
// are remembered before the kernel runs and snapshotted after it, so that the
// recompute's own arguments can be given the same contents.
ReplayStorage::PendingSave ReplayStorage::beginSave(int64_t occurrence, const c10::OperatorHandle& op,
                                                    const torch::jit::Stack& stack) {
  const std::vector<bool> written = writtenArguments(op.schema());
  const size_t args_begin = stack.size() - written.size();
  PendingSave pending{occurrence, {}};
  for (size_t i = 0; i < written.size(); ++i) {
    if (written[i]) pending.written_args.push_back(stack[args_begin + i]);
  }
  return pending;
}

int64_t ReplayStorage::keep(PendingSave pending, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const int64_t occurrence = pending.occurrence;
  const std::vector<c10::IValue>& written_args = pending.written_args;
  const size_t num_returns = schema.returns().size();
  // An asynchronous op's results are final once its Work completes (Note [Served Work handles]).
  if (!written_args.empty()) waitWorks(stack, num_returns);
  Entry entry;
  // Clones (only when mutation is allowed, or for snapshots) must not be seen as region ops.
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  if (isFunctionalCollective(schema)) waitFunctionalOutputs(*stack, num_returns);
  for (const c10::IValue& w : written_args) {
    forEachTensor(w, [&](const at::Tensor& t) {
      entry.written.push_back(t.defined() ? t.clone() : t);
      entry.bytes += tensorBytes(t);
    });
  }
  entry.outputs.reserve(num_returns);
  for (size_t j = 0; j < num_returns; ++j) {
    const c10::IValue& ret = (*stack)[stack->size() - num_returns + j];
    if (aliasedArgument(schema, j) >= 0) {
      entry.outputs.emplace_back();  // served as the recompute's own argument
      continue;
    }
    if (isWork(ret)) {
      entry.outputs.push_back(completedWork());
      continue;
    }
    entry.outputs.push_back(mapTensors(ret, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      entry.bytes += tensorBytes(t);
      if (clone_when_kept_) return t.clone();
      at::Tensor alias = detachedAlias(t);
      const c10::VariableVersion& counter = alias.unsafeGetTensorImpl()->version_counter();
      entry.versions.emplace_back(counter, counter.current_version());
      if (alias.has_storage()) entry.storages.push_back(alias.storage().unsafeGetStorageImpl());
      return alias;
    }));
  }
  entry.op_name = &op.operator_name();
  const int64_t bytes = entry.bytes;
  ++entries_;
  bytes_ += bytes;
  for (const c10::StorageImpl* s : entry.storages) cached_storage_[s] = Key{opId(op), occurrence};
  const bool inserted = storage_.emplace(Key{opId(op), occurrence}, std::move(entry)).second;
  TORCH_INTERNAL_ASSERT(inserted, "hpac: duplicate storage key for ", messageOpName(op.operator_name()),
                        " occurrence ", occurrence);
  return bytes;
}

// Note [Unsafe aliases]
// A cached output is checked for in-place writes through its version counter,
// which its views share. aten::_unsafe_view and the unsafe_split/chunk ops
// return tensors over the same storage with a version counter of their own:
// `matmul(x, w)` on a non-contiguous 3-D input is mm followed by _unsafe_view,
// and a later `add_` on the result writes into the cached mm output without
// bumping its counter — the recompute would then be served the written values
// (silently wrong gradients). So in the forward, the outputs of these ops that
// share storage with a cached output have their version counters watched too.
void ReplayStorage::watchUnsafeAliases(const torch::jit::Stack& stack, size_t num_returns) {
  for (size_t j = stack.size() - num_returns; j < stack.size(); ++j) {
    forEachTensor(stack[j], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const auto hit = cached_storage_.find(t.storage().unsafeGetStorageImpl());
      if (hit == cached_storage_.end()) return;
      const c10::VariableVersion& counter = t.unsafeGetTensorImpl()->version_counter();
      storage_.at(hit->second).versions.emplace_back(counter, counter.current_version());
    });
  }
}

// Note [Copy on write]
// A cached output is an alias: it shares storage with the tensor the forward
// goes on using. When a forward op is about to write into that storage (an
// in-place op or out= argument on the output itself, on a view of it, or on an
// unsafe alias such as the _unsafe_view after mm), the entry first takes a
// private copy of what it saved, so the recompute is served the values the op
// produced. Writes hpac cannot see (user code after the region) are caught by
// the version check at serve time instead.
void ReplayStorage::copyOnWrite(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const std::vector<bool> written = writtenArguments(schema);
  const size_t args_begin = stack.size() - written.size();
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) continue;
    forEachTensor(stack[args_begin + i], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const auto hit = cached_storage_.find(t.storage().unsafeGetStorageImpl());
      if (hit == cached_storage_.end()) return;
      makePrivate(storage_.at(hit->second));
    });
  }
}

// The entry's outputs become clones of the aliases it held: nothing outside the region can write to them, so their
// storages and version counters are no longer watched (Note [Copy on write]; Invocation::settleLast() under cache
// mutation).
void ReplayStorage::makePrivate(Entry& entry) {
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  for (c10::IValue& out : entry.outputs) {
    out = mapTensors(out, [](const at::Tensor& cached) { return cached.defined() ? cached.clone() : cached; });
  }
  for (const c10::StorageImpl* s : entry.storages) cached_storage_.erase(s);
  entry.storages.clear();
  entry.versions.clear();
}

int64_t ReplayStorage::discard(const Key& key) {
  const auto it = storage_.find(key);
  if (it == storage_.end()) return -1;
  const int64_t bytes = it->second.bytes;
  release(it->second);
  storage_.erase(it);
  return bytes;
}

// Note [Outer saved-tensor hooks]
int64_t ReplayStorage::packKept(const OuterHooks& hooks) {
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());  // the hooks' own ops are not the region's
  int64_t packed = 0;
  for (auto& [key, entry] : storage_) {
    if (entry.served || !entry.packed.empty()) continue;
    bool gave_none = false;
    auto pack = [&](const at::Tensor& t) -> at::Tensor {
      entry.defined.push_back(t.defined());
      if (!t.defined()) return t;
      std::unique_ptr<torch::autograd::SavedVariableHooks> pair = hooks.make();
      if (pair == nullptr) {
        gave_none = true;
        return t;
      }
      pair->call_pack_hook(t);
      entry.packed.push_back(std::move(pair));
      ++packed;
      return at::Tensor();
    };
    for (c10::IValue& out : entry.outputs) out = mapTensors(out, pack);
    for (at::Tensor& w : entry.written) w = pack(w);
    TORCH_INTERNAL_ASSERT(!gave_none || entry.packed.empty(), "hpac: the outer saved-tensor hooks vanished while "
                          "invocation ", invocation_, " packed its kept outputs");
    if (gave_none) {
      entry.defined.clear();
      return packed;
    }
    for (const c10::StorageImpl* s : entry.storages) cached_storage_.erase(s);
    entry.storages.clear();
  }
  return packed;
}

void ReplayStorage::unpack(Entry& entry) {
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  size_t slot = 0;
  size_t next = 0;
  auto unpacked = [&](const at::Tensor&) -> at::Tensor {
    TORCH_INTERNAL_ASSERT(slot < entry.defined.size(), "hpac: packed entry of invocation ", invocation_, " is short");
    if (!entry.defined[slot++]) return at::Tensor();
    return entry.packed[next++]->call_unpack_hook();
  };
  for (c10::IValue& out : entry.outputs) out = mapTensors(out, unpacked);
  for (at::Tensor& w : entry.written) w = unpacked(w);
  entry.packed.clear();
  entry.defined.clear();
}

// Recompute, SAVE: the kernel does not run. Pop the arguments, push fresh
// aliases of what the forward kept, and release the entry.
void ReplayStorage::serve(Entry& entry, int64_t occurrence, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TORCH_CHECK(!entry.served, "hpac: ", messageOpName(op.operator_name()), " occurrence ", occurrence,
              " of invocation ", invocation_,
              " was already served: backward ran through this selective checkpoint region an extra time. "
              "Saved outputs are released as they are served; for a second backward use full "
              "checkpointing (no policy) for this region or run the forward again.");
  if (!allow_cache_mutation_) {
    for (const auto& [counter, version] : entry.versions) {
      const uint32_t now = counter.current_version();
      if (C10_LIKELY(now == version)) continue;
      const uint32_t at_save = version;
      release(entry);  // reported by this error, not again as unserved (ends `version`'s lifetime)
      TORCH_CHECK(false, "hpac: the cached output of ", messageOpName(op.operator_name()), " occurrence ", occurrence,
                  " of invocation ", invocation_, " was modified in place after it was saved (version ", at_save,
                  " at save, ", now,
                  " now): it was mutated after the region, so serving it would give wrong gradients (writes inside "
                  "the region are copied on write). Don't write to it before backward, or set "
                  "allow_cache_entry_mutation=True (saved outputs are then cloned when saved).");
    }
  }
  if (!entry.packed.empty()) unpack(entry);  // Note [Outer saved-tensor hooks]
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t args_begin = stack->size() - num_args;
  std::vector<c10::IValue> args(std::make_move_iterator(stack->begin() + args_begin),
                                std::make_move_iterator(stack->end()));
  stack->erase(stack->begin() + args_begin, stack->end());
  {
    c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
    size_t w = 0;
    const std::vector<bool> written = writtenArguments(schema);
    for (size_t i = 0; i < num_args; ++i) {
      if (!written[i]) continue;
      forEachTensor(args[i], [&](const at::Tensor& t) {
        TORCH_CHECK(w < entry.written.size(), "hpac: ", messageOpName(op.operator_name()), " occurrence ", occurrence,
                    " of invocation ", invocation_, " writes more tensors in recompute than in forward");
        if (t.defined()) const_cast<at::Tensor&>(t).copy_(entry.written[w]);
        ++w;
      });
    }
  }
  for (size_t j = 0; j < entry.outputs.size(); ++j) {
    const int64_t aliased = aliasedArgument(schema, j);
    if (aliased >= 0) {
      stack->push_back(args[aliased]);
    } else {
      stack->push_back(mapTensors(entry.outputs[j],
                                  [](const at::Tensor& t) { return t.defined() ? detachedAlias(t) : t; }));
    }
  }
  release(entry);
}

ReplayStorage::Unserved ReplayStorage::releaseUnserved(bool completed) {
  Unserved unserved;
  std::string names;
  for (auto& [key, entry] : storage_) {
    if (entry.served) continue;
    if (unserved.count < 3) {
      names += (unserved.count ? ", " : "") +
               (entry.op_name ? messageOpName(*entry.op_name) : std::string("?")) + " occurrence " +
               std::to_string(key.occurrence);
    }
    ++unserved.count;
    unserved.bytes += entry.bytes;
    release(entry);
  }
  if (unserved.count > 0 && completed) {
    TORCH_WARN("hpac: the recompute of invocation ", invocation_, " completed without asking for ", unserved.count,
               " saved output(s) (", unserved.bytes, " bytes): ", names, unserved.count > 3 ? ", ..." : "",
               ". The region ran fewer ops in backward than in forward; they were released.");
  }
  return unserved;
}

void ReplayStorage::releaseAll() {
  for (auto& [key, entry] : storage_) {
    if (!entry.served) release(entry);
  }
}

// Drops what an entry holds; the key stays, marked served, so that asking for it again is
// "already served" (an extra backward), not "not in storage".
void ReplayStorage::release(Entry& entry) {
  --entries_;
  bytes_ -= entry.bytes;
  for (const c10::StorageImpl* s : entry.storages) cached_storage_.erase(s);
  entry = Entry{};
  entry.served = true;
}

}  // namespace hpac
