// Self-registration of libhpac.so: runs when the library is loaded (linked,
// LD_PRELOADed, or torch.ops.load_library'ed).
//
// Note [Safe registration]
// Registering a second fallback on a key, or a second library for a namespace,
// throws from inside the dispatcher; from a static constructor that would be
// std::terminate and take the whole process down. So nothing here uses the
// TORCH_LIBRARY macros: the Library objects are built in a function that first
// asks the dispatcher whether the key and the namespace are free, and catches
// anything else. When the key is taken, this copy stays inactive, says so once
// on stderr, and records the reason; entering a region then throws that reason
// as a c10::Error (fallbackStatus(), checkFallbackRegistered()).
// Loading the same file twice is a no-op by construction: the dynamic loader
// returns the handle it already has and runs no constructor again.
#include "plugin/fallback.h"
#include "plugin/ops.h"

#include "replay/dispatch_key.h"

#include <c10/core/DispatchKey.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <iostream>
#include <memory>

#ifndef HPAC_VERSION
#define HPAC_VERSION "unknown"
#endif

namespace hpac {

const char* version() {
  return HPAC_VERSION;
}

std::string libraryPath() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&libraryPath), &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return "(unknown path)";
}

namespace {

// Asks a copy of hpac that is already registered where it was loaded from.
std::string otherHpacOwner() {
  auto op = c10::Dispatcher::singleton().findSchema({"hpac::library_path", ""});
  if (!op) return "";
  try {
    torch::jit::Stack stack;
    op->callBoxed(&stack);
    return "hpac loaded from " + stack.back().toStringRef();
  } catch (...) {
    return "another copy of hpac";
  }
}

struct Registration {
  std::unique_ptr<torch::Library> fallback;
  std::unique_ptr<torch::Library> ops;
};

Registration& registration() {
  static Registration r;  // destroyed at unload: the Library destructors deregister
  return r;
}

void registerAtLoad() {
  auto& dispatcher = c10::Dispatcher::singleton();
  Registration& r = registration();
  // The op namespace first, and even when the fallback cannot be registered:
  // it is how users ask what went wrong (torch.ops.hpac.fallback_status()).
  // A copy of hpac that is already loaded keeps serving it.
  if (!dispatcher.findSchema({"hpac::version", ""})) {
    r.ops = std::make_unique<torch::Library>(torch::Library::DEF, "hpac", c10::nullopt, __FILE__, __LINE__);
    registerHpacOps(*r.ops);
  }
  const std::string& env_error = dispatchKeyEnvError();
  if (!env_error.empty()) {
    setFallbackStatus(false, env_error);
    std::cerr << "hpac: " << env_error << "; hpac stays inactive in this process\n";
    return;
  }
  const c10::DispatchKey key = dispatchKey();
  if (dispatcher.hasBackendFallbackForDispatchKey(key)) {
    std::string owner = otherHpacOwner();
    if (owner.empty() || r.ops) {
      owner = "the running torch or another extension (a torch with a C++ FakeTensor owns Fake)";
    }
    const std::string reason = std::string("dispatch key ") + c10::toString(key) + " already has a fallback, owned by " +
                               owner + "; this copy of hpac (" + libraryPath() +
                               ") did not register. Load only one libhpac.so per process, or choose a free key "
                               "with " + kDispatchKeyEnv + "=<key>";
    setFallbackStatus(false, reason);
    std::cerr << "hpac: " << reason << "\n";
    return;
  }
  r.fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", key, __FILE__, __LINE__);
  r.fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&hpacFallback>());
  setFallbackStatus(true, "");
}

const bool registered_at_load = [] {
  try {
    registerAtLoad();
  } catch (const std::exception& e) {
    setFallbackStatus(false, std::string("registration failed: ") + e.what());
    std::cerr << "hpac: registration failed, hpac stays inactive: " << e.what() << "\n";
  } catch (...) {
    setFallbackStatus(false, "registration failed with an unknown exception");
  }
  return true;
}();

}  // namespace
}  // namespace hpac
