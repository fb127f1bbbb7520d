// hpac/plugin/fallback.h
//
// The boxed fallback hpac registers on dispatchKey() (see
// Note [Why DispatchKey::Fake] in replay/dispatch_key.h), and its registration.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <string>

namespace hpac {

// The fallback itself: hands the op to the active region's invocation.
void hpacFallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

// How many times the fallback was entered on this thread (tests use it to show
// that ops outside regions never reach hpac).
uint64_t fallbackEntriesOnThisThread();

// Note [Meta ops are not the region's] (fallback.cpp), and its exception: while a step is planned on the meta
// device (hpac.plan), meta ops are the region's like any other, and every meta op counts only its outputs at the
// peaks (Note [A meta op holds its outputs], replay/tracking_allocator.h: hpac's key is in this thread's include
// set from on to off). The setting is process-wide; returns the previous one.
bool setMetaOpsInRegions(bool on);

// The version of this build and the path of the loaded libhpac.so.
const char* version();
std::string libraryPath();

// The torch version this libhpac was compiled against (CMake's Torch_VERSION)
// and the one running in this process ("" if it cannot be told); see
// Note [One torch per libhpac] in plugin/registration.cpp.
const char* builtForTorch();
std::string runningTorchVersion();
// Whether two torch versions ("2.13.0", "2.13.1+cpu") are one release (major.minor), hence one C++ ABI.
bool sameTorchRelease(const std::string& a, const std::string& b);

}  // namespace hpac
