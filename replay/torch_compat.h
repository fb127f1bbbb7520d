// hpac/replay/torch_compat.h
//
// The torch hpac was compiled against, and the few places where libtorch's C++
// API differs between the versions hpac is tested on (Debian's 1.13.1 and pip's
// 2.13.0). CMake defines HPAC_TORCH_VERSION_{MAJOR,MINOR} and
// HPAC_TORCH_VERSION from the Torch package it found.
#pragma once

#if !defined(HPAC_TORCH_VERSION_MAJOR) || !defined(HPAC_TORCH_VERSION_MINOR)
#error "hpac: HPAC_TORCH_VERSION_MAJOR/MINOR are set by CMake (policy/CMakeLists.txt); build through CMake"
#endif

#define HPAC_TORCH_AT_LEAST(major, minor) \
  (HPAC_TORCH_VERSION_MAJOR > (major) ||  \
   (HPAC_TORCH_VERSION_MAJOR == (major) && HPAC_TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate lost its const and gained copy_data() in torch 2.3.
#if HPAC_TORCH_AT_LEAST(2, 3)
#define HPAC_ALLOCATOR_CONST
#else
#define HPAC_ALLOCATOR_CONST const
#endif

// torch.set_warn_always(): c10::Warning::get_warnAlways() until torch 2.0, c10::WarningUtils:: since 2.1 (when
// Warning became a class).
#include <c10/util/Exception.h>
namespace hpac {
inline bool torchWarnsAlways() {
#if HPAC_TORCH_AT_LEAST(2, 1)
  return c10::WarningUtils::get_warnAlways();
#else
  return c10::Warning::get_warnAlways();
#endif
}
}  // namespace hpac
