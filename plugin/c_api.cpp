#include "plugin/c_api.h"

#include "policy/policy_kind.h"
#include "replay/dispatch_key.h"
#include "replay/invocation.h"
#include "replay/region.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

struct hpac_invocation {
  std::unique_ptr<hpac::Invocation> invocation;
  std::unique_ptr<hpac::RegionGuard> region;
};

namespace {

thread_local std::string last_error;

template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown exception";
  }
  return 1;
}

}  // namespace

extern "C" {

int hpac_invocation_create(const char* kind, hpac_invocation** out) {
  return guarded([&] {
    constexpr const char* kCaller = "hpac_invocation_create";
    const hpac::PolicyFactory policy = hpac::policyForKind(hpac::parsePolicyKind(kind ? kind : "", kCaller), {}, kCaller);
    auto* inv = new hpac_invocation;
    inv->invocation = std::make_unique<hpac::Invocation>(policy);
    *out = inv;
  });
}

int hpac_region_enter(hpac_invocation* inv, int phase) {
  return guarded([&] {
    TORCH_CHECK(inv != nullptr, "hpac_region_enter: null invocation");
    TORCH_CHECK(phase == 0 || phase == 1, "hpac_region_enter: phase ", phase, " is not 0 (forward) or 1 (recompute)");
    TORCH_CHECK(!inv->region, "hpac_region_enter: invocation ", inv->invocation->id(), " is already in a region");
    inv->region = std::make_unique<hpac::RegionGuard>(*inv->invocation,
                                                      phase == 0 ? hpac::Phase::kForward : hpac::Phase::kRecompute);
  });
}

int hpac_region_exit(hpac_invocation* inv) {
  return guarded([&] {
    TORCH_CHECK(inv != nullptr && inv->region, "hpac_region_exit: invocation is not in a region");
    inv->region.reset();
  });
}

void hpac_invocation_destroy(hpac_invocation* inv) {
  delete inv;
}

const char* hpac_last_error(void) {
  return last_error.c_str();
}

const void* hpac_operator(const char* name, const char* overload) {
  if (name == nullptr) return nullptr;
  std::string over = overload == nullptr ? "" : overload;
  if (over == "default") over.clear();
  // One handle per operator for the life of the process (the Python side caches it per OpOverload).
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, std::unique_ptr<c10::OperatorHandle>> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = handles[{name, over}];
  if (!slot) {
    const auto found = c10::Dispatcher::singleton().findSchema({name, over});
    if (!found) return nullptr;
    slot = std::make_unique<c10::OperatorHandle>(*found);
  }
  return slot.get();
}

int hpac_invocation_settle_last(void* invocation, const void* op, int policy) {
  bool settled = false;
  const int failed = guarded([&] {
    TORCH_CHECK(invocation != nullptr && op != nullptr, "hpac_invocation_settle_last: null invocation or operator");
    TORCH_CHECK(policy >= 0 && policy <= 3, "hpac_invocation_settle_last: policy ", policy,
                " is not 0..3 (MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE, PREFER_RECOMPUTE)");
    settled = static_cast<hpac::Invocation*>(invocation)->settleLast(
        *static_cast<const c10::OperatorHandle*>(op), static_cast<hpac::CheckpointPolicy>(policy));
  });
  return failed ? -1 : (settled ? 1 : 0);
}

int hpac_invocation_runs_in_recompute(const void* invocation, const void* op) {
  if (invocation == nullptr || op == nullptr) return 1;
  const auto& handle = *static_cast<const c10::OperatorHandle*>(op);
  return static_cast<const hpac::Invocation*>(invocation)->runsInRecompute(handle) ? 1 : 0;
}

int hpac_exclude_key(int excluded) {
  const c10::DispatchKey key = hpac::dispatchKey();
  const bool previous = c10::impl::tls_is_dispatch_key_excluded(key);
  c10::impl::tls_set_dispatch_key_excluded(key, excluded != 0);
  return previous ? 1 : 0;
}

}  // extern "C"
