// hpac/replay/dispatch_key.h
//
// The dispatch key hpac's fallback lives on, and whether the fallback is in
// place. Both the plugin (which registers the fallback) and the region guard
// (which switches the key on) read it from here, so neither folder includes
// the other's headers in a loop: plugin -> replay -> policy.
//
// Note [Why DispatchKey::Fake]
// hpac must see every op after autograd has recorded it and before a backend
// kernel runs: the layer where a Python TorchDispatchMode sits. Fake sits
// between BackendSelect/Python and ADInplaceOrView/Autograd, and with it in the
// TLS include set the fallback sees post-autograd ops in their functional form
// (t, mm, addmm, _softmax, topk, index_add_, views, factories) while autograd
// stays AutogradCPU/CUDA. Nothing in libtorch 1.13 (or Debian's python3-torch)
// registers a fallback on it; it was reserved for torchdistx.
// PrivateUse1/2/3 were measured and rejected: functional ops then arrive as
// out= variants, t/transpose/empty are never seen, sparse tensors break,
// serving a cached output leaves out= unwritten (wrong gradients), an include
// guard on a backend key leaves its backend bit set after it ends, overhead was
// ~4x higher, and PrivateUse1 belongs to out-of-tree devices (NPU, ...).
// Torch builds with a C++ FakeTensor (pytorch#183776, 2026) own Fake
// themselves; there the fallback is not registered and hpac says so (see
// fallbackStatus()). HPAC_DISPATCH_KEY=<name> picks another key at load time;
// only Fake is tested.
#pragma once

#include <c10/core/DispatchKey.h>

#include <string>

namespace hpac {

constexpr c10::DispatchKey kDefaultDispatchKey = c10::DispatchKey::Fake;
constexpr const char* kDispatchKeyEnv = "HPAC_DISPATCH_KEY";

// The key in use: HPAC_DISPATCH_KEY if set and valid, else kDefaultDispatchKey.
// Resolved once per process. Never throws (it runs from static constructors).
c10::DispatchKey dispatchKey();

// Why HPAC_DISPATCH_KEY was rejected (naming the value and what is allowed);
// empty when it is unset or valid.
const std::string& dispatchKeyEnvError();

// Parses a key name for HPAC_DISPATCH_KEY. Returns false and fills `error`
// (naming the bad value and what is allowed) when the name is not usable.
bool parseDispatchKeyName(const std::string& name, c10::DispatchKey* key, std::string* error);

// Set by the plugin when it loads: whether this copy of hpac owns the fallback
// on dispatchKey(), and if not, why.
void setFallbackStatus(bool registered, std::string reason);

struct FallbackStatus {
  bool registered;
  std::string reason;  // empty when registered
};
FallbackStatus fallbackStatus();

// Throws c10::Error with the recorded reason unless the fallback is in place.
void checkFallbackRegistered();

}  // namespace hpac
