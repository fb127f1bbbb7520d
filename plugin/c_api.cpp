#include "plugin/c_api.h"

#include "policy/policy_kind.h"
#include "replay/invocation.h"
#include "replay/region.h"

#include <memory>
#include <string>

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

}  // extern "C"
