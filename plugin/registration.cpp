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
//
// Note [One torch per libhpac]
// libhpac is compiled against one torch's C++ headers, and libtorch has no
// stable C++ ABI across minor versions (c10::Allocator, the autograd Engine and
// c10d::Work changed between 1.13 and 2.x). Before touching the dispatcher the
// load compares the torch version it was built for (HPAC_TORCH_VERSION, also
// kept in the file as the marker kTorchMarker so that the Python module can
// read it without loading) with the running one (at::show_config()'s
// TORCH_VERSION, present in 1.13 and 2.x); on a different major.minor it
// registers nothing, says so naming both versions, and stays inactive.
// Where the two torches' libraries have different names (Debian's versioned
// libtorch_cpu.so.1.13 beside a wheel's libtorch_cpu.so), the dynamic loader
// pulls the second libtorch in with libhpac and its own static constructors
// crash before hpac's code runs; only a check before dlopen can catch that,
// and hpac.load() makes it (plugin/python/hpac).
#include "plugin/fallback.h"
#include "plugin/ops.h"

#include "replay/dispatch_key.h"

#include <ATen/Version.h>
#include <c10/core/DispatchKey.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <iostream>
#include <memory>

#ifndef HPAC_VERSION
#define HPAC_VERSION "unknown"
#endif

// The marker Note [One torch per libhpac] refers to: "hpac-built-for-torch=X.Y.Z;".
extern "C" __attribute__((used, visibility("default"))) const char hpac_built_for_torch[] =
    "hpac-built-for-torch=" HPAC_TORCH_VERSION ";";

namespace hpac {

const char* version() {
  return HPAC_VERSION;
}

const char* builtForTorch() {
  return HPAC_TORCH_VERSION;
}

std::string runningTorchVersion() {
  const std::string config = at::show_config();
  const std::string tag = "TORCH_VERSION=";
  const size_t at = config.find(tag);
  if (at == std::string::npos) return "";
  const size_t begin = at + tag.size();
  return config.substr(begin, config.find_first_of(", \n", begin) - begin);
}

bool sameTorchRelease(const std::string& a, const std::string& b) {
  // major.minor: "2.13.0" and "2.13.1" share an ABI; "1.13.0" and "2.13.0" do not.
  auto major_minor = [](const std::string& v) { return v.substr(0, v.find('.', v.find('.') + 1)); };
  return !a.empty() && !b.empty() && major_minor(a) == major_minor(b);
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
  const std::string running = runningTorchVersion();
  if (!sameTorchRelease(running, builtForTorch())) {
    const std::string reason = std::string("this libhpac (") + libraryPath() + ") was built for torch " +
                               builtForTorch() + " but the process runs torch " +
                               (running.empty() ? "of an unknown version" : running) +
                               "; hpac registered nothing and stays inactive. Rebuild hpac against the running "
                               "torch (HPAC_TORCH_PYTHON=<its python> tools/build.sh)";
    setFallbackStatus(false, reason);
    std::cerr << "hpac: " << reason << "\n";
    return;
  }
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
