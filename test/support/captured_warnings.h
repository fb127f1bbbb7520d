// CapturedWarnings: collects c10 warnings (TORCH_WARN) while alive, for tests
// that count them. The handler interface differs between torch 1.13 and 2.x.
#pragma once

#include "replay/torch_compat.h"

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace hpac {

class CapturedWarnings final : public c10::WarningHandler {
 public:
  CapturedWarnings() : previous_(getHandler()) { setHandler(this); }
  ~CapturedWarnings() override { setHandler(previous_); }
#if HPAC_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  static c10::WarningHandler* getHandler() { return c10::WarningUtils::get_warning_handler(); }
  static void setHandler(c10::WarningHandler* h) { c10::WarningUtils::set_warning_handler(h); }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override { messages.push_back(msg); }
  static c10::WarningHandler* getHandler() { return c10::Warning::get_warning_handler(); }
  static void setHandler(c10::WarningHandler* h) { c10::Warning::set_warning_handler(h); }
#endif
  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

}  // namespace hpac
