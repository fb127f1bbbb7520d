// ReplayStorage on its own, without a region: what keep() holds and counts,
// serve() hands back and releases, a second serve refused, copy on write,
// discard and the release of what a recompute never asked for.
#include "replay/replay_storage.h"

#include "replay/op_occurrence.h"
#include "test/support/error_message.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

namespace hpac {
namespace {

const c10::OperatorHandle& mmOp() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  return op;
}

const c10::OperatorHandle& addInPlaceOp() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add_", "Tensor");
  return op;
}

// Keeps `out` as the output of mm occurrence `occurrence`, as the fallback does after the kernel.
int64_t keepMm(ReplayStorage& storage, const at::Tensor& a, const at::Tensor& out, int64_t occurrence) {
  torch::jit::Stack stack{a, a};
  ReplayStorage::PendingSave pending = ReplayStorage::beginSave(occurrence, mmOp(), stack);
  stack = {out};
  return storage.keep(std::move(pending), mmOp(), &stack);
}

// Serves mm occurrence `occurrence` to a recompute whose arguments are `a`, `a`; returns what it pushed.
at::Tensor serveMm(ReplayStorage& storage, const at::Tensor& a, int64_t occurrence) {
  ReplayStorage::Entry* entry = storage.find(OpOccurrence{opId(mmOp()), occurrence});
  EXPECT_NE(entry, nullptr);
  torch::jit::Stack stack{a, a};
  storage.serve(*entry, occurrence, mmOp(), &stack);
  EXPECT_EQ(stack.size(), 1u);
  return stack.back().toTensor();
}

TEST(ReplayStorage, KeepsAliasesServesThemOnceAndCountsBytes) {
  ReplayStorage storage(/*invocation=*/7, /*allow_cache_mutation=*/false, /*clone_when_kept=*/false);
  const at::Tensor a = at::randn({4, 4});
  const at::Tensor out = at::mm(a, a);
  EXPECT_EQ(keepMm(storage, a, out, 0), 4 * 4 * 4);
  EXPECT_EQ(storage.entries(), 1u);
  EXPECT_EQ(storage.bytes(), 4 * 4 * 4);
  EXPECT_TRUE(storage.holds(out.storage().unsafeGetStorageImpl())) << "an alias shares the output's storage";
  EXPECT_TRUE(storage.contains(OpOccurrence{opId(mmOp()), 0}));
  EXPECT_FALSE(storage.contains(OpOccurrence{opId(mmOp()), 1}));

  const at::Tensor served = serveMm(storage, a, 0);
  EXPECT_TRUE(at::equal(served, out));
  EXPECT_NE(served.unsafeGetTensorImpl(), out.unsafeGetTensorImpl());  // a fresh alias
  EXPECT_EQ(storage.entries(), 0u);
  EXPECT_EQ(storage.bytes(), 0);
  EXPECT_FALSE(storage.watchesStorages());
  // The key stays, marked served: asking again is an extra backward.
  const std::string msg = errorMessageOf([&] { serveMm(storage, a, 0); });
  EXPECT_NE(msg.find("aten::mm (default overload) occurrence 0 of invocation 7 was already served"), std::string::npos)
      << msg;
}

TEST(ReplayStorage, AWriteAfterKeepIsRefusedUnlessCopiedOnWrite) {
  const at::Tensor a = at::randn({3, 3});
  {
    ReplayStorage storage(/*invocation=*/8, false, false);
    at::Tensor out = at::mm(a, a);
    keepMm(storage, a, out, 0);
    out.add_(1);  // a write the storage was not told of (user code after the region)
    const std::string msg = errorMessageOf([&] { serveMm(storage, a, 0); });
    EXPECT_NE(msg.find("occurrence 0 of invocation 8 was modified in place after it was saved"), std::string::npos)
        << msg;
    EXPECT_EQ(storage.entries(), 0u) << "the refused entry is released";
  }
  {
    ReplayStorage storage(/*invocation=*/9, false, false);
    at::Tensor out = at::mm(a, a);
    const at::Tensor before = out.clone();
    keepMm(storage, a, out, 0);
    const torch::jit::Stack add{out, at::ones({3, 3}), c10::Scalar(1)};
    storage.copyOnWrite(addInPlaceOp().schema(), add);  // Note [Copy on write]: the fallback's call before add_
    EXPECT_FALSE(storage.holds(out.storage().unsafeGetStorageImpl()));
    out.add_(1);
    EXPECT_TRUE(at::equal(serveMm(storage, a, 0), before));
  }
}

TEST(ReplayStorage, DiscardAndReleaseUnserved) {
  ReplayStorage storage(/*invocation=*/10, false, false);
  const at::Tensor a = at::randn({2, 2});
  const at::Tensor out0 = at::mm(a, a);
  const at::Tensor out1 = at::mm(a, a);
  const at::Tensor out2 = at::mm(a, a);
  keepMm(storage, a, out0, 0);
  keepMm(storage, a, out1, 1);
  keepMm(storage, a, out2, 2);
  EXPECT_EQ(storage.discard(OpOccurrence{opId(mmOp()), 0}), 2 * 2 * 4);
  EXPECT_EQ(storage.discard(OpOccurrence{opId(mmOp()), 0}), -1) << "gone as if never kept";
  EXPECT_FALSE(storage.contains(OpOccurrence{opId(mmOp()), 0}));
  serveMm(storage, a, 1);
  const ReplayStorage::Unserved unserved = storage.releaseUnserved(/*completed=*/false);
  EXPECT_EQ(unserved.count, 1);
  EXPECT_EQ(unserved.bytes, 2 * 2 * 4);
  EXPECT_EQ(storage.entries(), 0u);
  EXPECT_EQ(storage.bytes(), 0);
}

}  // namespace
}  // namespace hpac
