// RegionGuard: the thread's region state and hpac's key in the TLS are
// restored after exceptions, regions do not nest, and only the ops autograd
// sees (not those inside kernels) are part of a region's sequence.
#include "policy/checkpoint_policy.h"
#include "replay/dispatch_key.h"
#include "replay/invocation.h"
#include "replay/region.h"
#include "test/support/error_message.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace hpac {
namespace {

TEST(Region, TlsIsRestoredAfterAnException) {
  const c10::DispatchKey key = dispatchKey();
  ASSERT_FALSE(c10::impl::tls_is_dispatch_key_included(key));
  Invocation inv(PolicyFactory{});
  const at::Tensor x = at::ones({2});
  EXPECT_THROW(
      {
        RegionGuard region(inv, Phase::kForward);
        EXPECT_TRUE(c10::impl::tls_is_dispatch_key_included(key));
        at::relu(x);
        throw std::runtime_error("user code failed");
      },
      std::runtime_error);
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(key));
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_excluded(key));
  EXPECT_EQ(currentRegion().invocation, nullptr);
  // The thread trains normally afterwards.
  Invocation next(PolicyFactory{});
  {
    RegionGuard region(next, Phase::kForward);
    at::relu(x);
  }
  EXPECT_EQ(next.stats().ops_forward, 1);
}

TEST(Region, RegionsDoNotNest) {
  Invocation outer(PolicyFactory{}), inner(PolicyFactory{});
  RegionGuard region(outer, Phase::kForward);
  const std::string msg = errorMessageOf([&] { RegionGuard nested(inner, Phase::kForward); });
  EXPECT_NE(msg.find("checkpoint regions do not nest"), std::string::npos) << msg;
  EXPECT_EQ(currentRegion().invocation, &outer);
}

TEST(Region, OpsInsideKernelsAreNotCounted) {
  // addmm's and softmax's CPU kernels allocate and call other ops internally;
  // only the ops autograd sees are part of the region's sequence.
  Invocation inv(PolicyFactory{});
  const at::Tensor x = at::randn({4, 8}), w = at::randn({8, 8}), b = at::randn({8});
  {
    RegionGuard region(inv, Phase::kForward);
    at::softmax(at::addmm(b, x, w), -1);
  }
  EXPECT_EQ(inv.stats().ops_forward, 2);  // addmm, _softmax
}

}  // namespace
}  // namespace hpac
