#include "plugin/c_api.h"

#include "policy/policy_kind.h"
#include "replay/dispatch_key.h"
#include "replay/invocation.h"
#include "replay/region.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
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

// Note [Operator handles follow registration]
// The C API hands out one OperatorHandle address per (name, overload), which hpac's Python package caches per
// OpOverload. A handle names an entry of the dispatcher's operator list, which deregistration frees (a
// torch.library.Library destroyed, a custom op redefined), so a cached handle can outlive its operator. A registration
// listener bumps a generation (it runs under the dispatcher's lock, so it touches nothing else: the cache's mutex is
// taken before the dispatcher's lock by hpac_operator, never after); the first hpac_operator call after the generation
// moved looks every cached name up again and refreshes its handle in place, or marks it absent. Addresses never
// change, so a stale address can at worst name the operator now registered under its name, never freed memory.
std::atomic<unsigned long long> operator_generation{0};

class GenerationListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle&) override { operator_generation.fetch_add(1); }
  void onOperatorDeregistered(const c10::OperatorHandle&) override { operator_generation.fetch_add(1); }
};

struct OperatorCache {
  struct Entry {
    std::unique_ptr<c10::OperatorHandle> handle;  // its address is what callers hold
    bool present = true;                          // registered at the last refresh
  };
  std::mutex mutex;
  std::map<std::pair<std::string, std::string>, Entry> entries;  // only names that were registered when asked
  unsigned long long generation = 0;  // of the last refresh
  std::unique_ptr<c10::RegistrationHandleRAII> listener;
};

OperatorCache& operatorCache() {
  static OperatorCache* cache = [] {
    auto* c = new OperatorCache();  // leaked: the listener may fire during static destruction
    c->generation = operator_generation.load();
    c->listener = std::make_unique<c10::RegistrationHandleRAII>(
        c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<GenerationListener>()));
    return c;
  }();
  return *cache;
}

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
    std::unique_ptr<hpac::RegionGuard> region = std::move(inv->region);
    region->end();  // what ending threw becomes this call's error (Note [Ending a region can fail])
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
  // Note [Operator handles follow registration]
  OperatorCache& cache = operatorCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const unsigned long long generation = operator_generation.load();
  if (generation != cache.generation) {
    cache.generation = generation;
    for (auto& [key, entry] : cache.entries) {
      const auto found = c10::Dispatcher::singleton().findSchema({key.first, key.second});
      entry.present = found.has_value();
      if (found) *entry.handle = *found;  // in place: the address callers hold names the operator registered now
    }
  }
  const auto it = cache.entries.find({name, over});
  if (it != cache.entries.end()) return it->second.present ? it->second.handle.get() : nullptr;
  const auto found = c10::Dispatcher::singleton().findSchema({name, over});
  if (!found) return nullptr;  // not cached: the names callers ask about are theirs to bound
  auto& entry = cache.entries[{name, over}];
  entry.handle = std::make_unique<c10::OperatorHandle>(*found);
  return entry.handle.get();
}

unsigned long long hpac_operator_generation(void) {
  operatorCache();  // the listener is registered before the first handle is handed out
  return operator_generation.load();
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
