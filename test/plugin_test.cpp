// The plug-in itself: the fallback is registered on hpac's key, the key sits
// below autograd and above the backends, the running torch is the one built
// for, and outside checkpoint regions the fallback is never entered.
#include "plugin/fallback.h"
#include "replay/dispatch_key.h"
#include "replay/invocation.h"
#include "replay/region.h"
#include "replay/torch_compat.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <string>

namespace hpac {
namespace {

TEST(Plugin, FallbackIsRegisteredOnTheNamedKey) {
  EXPECT_EQ(dispatchKey(), c10::DispatchKey::Fake);
  EXPECT_TRUE(c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(dispatchKey()));
  const FallbackStatus s = fallbackStatus();
  EXPECT_TRUE(s.registered) << s.reason;
  EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({"hpac::version", ""}).has_value());
}

// Note [Why DispatchKey::Fake], measured per torch: the key is a functionality
// key below autograd (and ADInplaceOrView) and above the dense backends, so
// ops reach it after autograd recorded them and before a kernel runs. Where it
// sits against Python (a TorchDispatchMode) moved: above it on 1.13, below it
// on 2.13 (pytorch#178428), so a Python mode now sees an op before hpac does.
TEST(Plugin, KeySitsBelowAutogradAndAboveTheBackends) {
  using K = c10::DispatchKey;
  const K key = dispatchKey();
  EXPECT_TRUE(c10::toFunctionalityKey(key) == key);
  EXPECT_LT(key, K::ADInplaceOrView);
  EXPECT_LT(key, K::AutogradFunctionality);
  EXPECT_LT(key, K::AutocastCPU);
  EXPECT_GT(key, K::Dense);
  EXPECT_GT(key, K::BackendSelect);
  std::cout << "torch " << HPAC_TORCH_VERSION << ": " << c10::toString(key) << " is "
            << (key > K::Python ? "above" : "below") << " Python, "
            << (key > K::Functionalize ? "above" : "below") << " Functionalize\n";
#if HPAC_TORCH_AT_LEAST(2, 0)
  EXPECT_LT(key, K::Python);
#else
  EXPECT_GT(key, K::Python);
#endif
}

// Note [One torch per libhpac]: what the load-time check compares.
TEST(Plugin, RunningTorchIsTheOneBuiltFor) {
  EXPECT_EQ(std::string(builtForTorch()), HPAC_TORCH_VERSION);
  const std::string running = runningTorchVersion();
  EXPECT_FALSE(running.empty());
  EXPECT_TRUE(sameTorchRelease(running, builtForTorch())) << running << " vs " << builtForTorch();
  EXPECT_TRUE(sameTorchRelease("2.13.0", "2.13.1+cpu"));
  EXPECT_FALSE(sameTorchRelease("1.13.0", "2.13.0"));
  EXPECT_FALSE(sameTorchRelease("2.13.0", "2.14.1+cu130"));
  EXPECT_FALSE(sameTorchRelease("", "2.13.0"));
}

TEST(Plugin, DispatchKeyNames) {
  c10::DispatchKey key;
  std::string error;
  EXPECT_TRUE(parseDispatchKeyName("Fake", &key, &error));
  EXPECT_EQ(key, c10::DispatchKey::Fake);
  EXPECT_FALSE(parseDispatchKeyName("Fakee", &key, &error));
  EXPECT_NE(error.find("'Fakee' is not a dispatch key name"), std::string::npos) << error;
  EXPECT_FALSE(parseDispatchKeyName("CPU", &key, &error));
  EXPECT_NE(error.find("backend"), std::string::npos) << error;
}

TEST(Plugin, FallbackNeverEnteredOutsideRegions) {
  const uint64_t before = fallbackEntriesOnThisThread();
  at::Tensor a = at::randn({8, 8}).set_requires_grad(true);
  at::Tensor y = at::softmax(at::mm(a, a), -1).sum();
  y.backward();
  EXPECT_EQ(fallbackEntriesOnThisThread(), before);

  Invocation inv(PolicyFactory{});
  {
    RegionGuard region(inv, Phase::kForward);
    at::relu(a);
  }
  EXPECT_GT(fallbackEntriesOnThisThread(), before);
  const uint64_t after_region = fallbackEntriesOnThisThread();
  at::relu(a);
  EXPECT_EQ(fallbackEntriesOnThisThread(), after_region);
}

}  // namespace
}  // namespace hpac
