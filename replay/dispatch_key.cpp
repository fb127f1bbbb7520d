#include "replay/dispatch_key.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <mutex>

namespace hpac {
namespace {

struct KeyChoice {
  c10::DispatchKey key = kDefaultDispatchKey;
  std::string error;  // why HPAC_DISPATCH_KEY was not used
};

const KeyChoice& keyChoice() {
  static const KeyChoice choice = [] {
    KeyChoice c;
    if (const char* env = std::getenv(kDispatchKeyEnv)) {
      c10::DispatchKey key;
      std::string error;
      if (parseDispatchKeyName(env, &key, &error)) {
        c.key = key;
      } else {
        c.error = error;
      }
    }
    return c;
  }();
  return choice;
}

std::mutex& statusMutex() {
  static std::mutex m;
  return m;
}
FallbackStatus& statusStorage() {
  static FallbackStatus s{false, "libhpac's fallback was never registered (the plugin's static registration did not run)"};
  return s;
}

}  // namespace

bool parseDispatchKeyName(const std::string& name, c10::DispatchKey* key, std::string* error) {
  const std::string allowed =
      "a functionality key such as Fake (the default; the only one tested), e.g. HPAC_DISPATCH_KEY=Fake";
  c10::DispatchKey parsed;
  try {
    parsed = c10::parseDispatchKey(name);
  } catch (const c10::Error&) {
    *error = std::string(kDispatchKeyEnv) + "='" + name + "' is not a dispatch key name; allowed: " + allowed;
    return false;
  }
  if (c10::isPerBackendFunctionalityKey(parsed) || c10::isAliasDispatchKey(parsed) ||
      c10::toFunctionalityKey(parsed) != parsed || parsed == c10::DispatchKey::Undefined) {
    *error = std::string(kDispatchKeyEnv) + "='" + name +
             "' names a backend, per-backend or alias key, which cannot host a mode fallback "
             "(see Note [Why DispatchKey::Fake]); allowed: " + allowed;
    return false;
  }
  *key = parsed;
  return true;
}

c10::DispatchKey dispatchKey() {
  return keyChoice().key;
}

const std::string& dispatchKeyEnvError() {
  return keyChoice().error;
}

void setFallbackStatus(bool registered, std::string reason) {
  std::lock_guard<std::mutex> lock(statusMutex());
  statusStorage() = FallbackStatus{registered, std::move(reason)};
}

FallbackStatus fallbackStatus() {
  std::lock_guard<std::mutex> lock(statusMutex());
  return statusStorage();
}

void checkFallbackRegistered() {
  // Fast path: read once registered; the status only changes at load time.
  static thread_local bool known_ok = false;
  if (known_ok) return;
  FallbackStatus s = fallbackStatus();
  TORCH_CHECK(s.registered, "hpac: cannot enter a checkpoint region: ", s.reason);
  known_ok = true;
}

}  // namespace hpac
