// hpac/test/support/error_message.h
//
// The message of the c10::Error `fn` throws, without its backtrace, or
// "(no error)": for tests that check what an error says.
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace hpac {

inline std::string errorMessageOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

}  // namespace hpac
