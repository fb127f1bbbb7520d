// hpac/replay/replay_storage.h
//
// ReplayStorage: what one invocation's forward keeps for its recompute, owned
// by the Invocation. Each op the forward saves becomes one Entry under
// (op, occurrence):
//   forward    beginSave() takes the arguments the op will write before its
//              kernel runs; keep() stores detached aliases (or clones) of its
//              returns and snapshots of those arguments. An op about to write
//              into a kept alias first makes the entry private (copyOnWrite,
//              Note [Copy on write]); unsafe aliases of a kept output have
//              their version counters watched (Note [Unsafe aliases]); at the
//              end of the forward, what is kept may be handed to the outer
//              saved-tensor hooks (packKept, Note [Outer saved-tensor hooks]).
//   recompute  find() gives a saved (op, occurrence) its entry; serve() pushes
//              fresh aliases of what it kept in place of running the kernel
//              and releases it. Entries a recompute never asked for are
//              released when it ends (releaseUnserved, Note [Decisions are
//              recorded], replay/invocation.cpp).
// A released entry keeps its key, marked served, so that asking for it again
// is "already served" (an extra backward), not "not in storage".
//
// Everything the fallback's hot path asks (find(), watchesStorages()) is
// inline; nothing here allocates for an op that is not saved or served.
// Thread safety: that of its Invocation (one thread at a time).
#pragma once

#include "replay/op_occurrence.h"
#include "replay/outer_hooks.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hpac {

// A new TensorImpl over the same storage, sharing the version counter, with no
// autograd metadata. Built without dispatching (aten::detach would re-enter the
// fallback) and without keeping the producer's autograd graph alive.
at::Tensor detachedAlias(const at::Tensor& t);

class ReplayStorage {
 public:
  // A saved op's outputs.
  struct Entry {
    std::vector<c10::IValue> outputs;  // detached aliases (or clones) of the returns
    std::vector<at::Tensor> written;   // snapshots of arguments the op wrote
    // Version counters watched for in-place writes, with their value when
    // watching began: the cached aliases' own, and those of unsafe aliases of
    // them (Note [Unsafe aliases]).
    std::vector<std::pair<c10::VariableVersion, uint32_t>> versions;
    std::vector<const c10::StorageImpl*> storages;  // of the cached aliases
    const c10::OperatorName* op_name = nullptr;     // for messages
    int64_t bytes = 0;
    bool served = false;
    // Note [Outer saved-tensor hooks]: one pair per defined tensor of outputs then written, in that order; the
    // tensors themselves are then undefined, `defined` says which were not.
    std::vector<std::unique_ptr<torch::autograd::SavedVariableHooks>> packed;
    std::vector<bool> defined;
  };
  // kSave: the arguments the op will write, taken before the kernel runs.
  struct PendingSave {
    int64_t occurrence;
    std::vector<c10::IValue> written_args;
  };
  // What releaseUnserved() released.
  struct Unserved {
    int64_t count = 0;
    int64_t bytes = 0;
  };

  // `invocation` names it in messages. `allow_cache_mutation`: a kept output may be written after the region (no
  // version check when served); `clone_when_kept`: keep() clones the returns instead of aliasing them.
  ReplayStorage(uint64_t invocation, bool allow_cache_mutation, bool clone_when_kept)
      : invocation_(invocation), allow_cache_mutation_(allow_cache_mutation), clone_when_kept_(clone_when_kept) {}

  // Entries still held (saved and not yet served), and their bytes.
  size_t entries() const { return entries_; }
  int64_t bytes() const { return bytes_; }
  // Whether a kept alias's storage is watched (the one check before copyOnWrite() and watchUnsafeAliases()).
  bool watchesStorages() const { return !cached_storage_.empty(); }
  // Whether `storage` is a kept alias's.
  bool holds(const c10::StorageImpl* storage) const { return cached_storage_.count(storage) != 0; }
  // The entry kept under `key` (served ones too), else null.
  Entry* find(const OpOccurrence& key) {
    const auto it = storage_.find(key);
    return it == storage_.end() ? nullptr : &it->second;
  }
  bool contains(const OpOccurrence& key) const { return storage_.count(key) != 0; }

  // Forward, kSave: before the kernel (the arguments it will write), then after it. keep() returns the entry's bytes.
  static PendingSave beginSave(int64_t occurrence, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  int64_t keep(PendingSave pending, const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // Forward, before a mutable op: entries whose kept aliases it writes become private (Note [Copy on write]).
  void copyOnWrite(const c10::FunctionSchema& schema, const torch::jit::Stack& stack);
  // Forward, after an unsafe-alias op: its outputs over a kept storage are watched (Note [Unsafe aliases]).
  void watchUnsafeAliases(const torch::jit::Stack& stack, size_t num_returns);
  // The entry under `key` keeps clones instead of aliases; its storages are no longer watched.
  void makePrivate(const OpOccurrence& key) { makePrivate(storage_.at(key)); }
  // Forward: the entry under `key` gone as if never kept; its bytes, or -1 when there was none.
  int64_t discard(const OpOccurrence& key);
  // Forward end: every entry handed to `hooks` (Note [Outer saved-tensor hooks]); returns the tensors packed.
  int64_t packKept(const OuterHooks& hooks);

  // Recompute, kServe: pops the arguments and pushes what the forward kept; releases the entry. Throws if it was
  // served already, or written after the region (unless cache mutation is allowed).
  void serve(Entry& entry, int64_t occurrence, const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // Recompute end: releases the entries it never asked for, with one warning when it `completed`.
  Unserved releaseUnserved(bool completed);
  // Releases every entry not served yet (Invocation::releaseKept).
  void releaseAll();

 private:
  using Key = OpOccurrence;
  using KeyHash = OpOccurrenceHash;
  void makePrivate(Entry& entry);
  void unpack(Entry& entry);
  void release(Entry& entry);

  const uint64_t invocation_;
  const bool allow_cache_mutation_;
  const bool clone_when_kept_;
  std::unordered_map<Key, Entry, KeyHash> storage_;
  // Storage of every cached alias still held -> its entry.
  std::unordered_map<const c10::StorageImpl*, Key> cached_storage_;
  size_t entries_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace hpac
