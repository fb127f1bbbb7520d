// Shared by the libFuzzer targets: what a parser may do with any input.
// Accept it, or reject it with a message that names where (file:line:col for
// YAML, the entry for op names). Anything else, an exception escaping, a crash,
// a sanitizer report, a hang, is a finding: the target aborts with the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

namespace hpac::fuzz {

[[noreturn]] inline void finding(const std::string& what, const std::string& input) {
  std::fprintf(stderr, "hpac fuzz finding: %s\n--- input ---\n%s\n--- end ---\n", what.c_str(), input.c_str());
  std::abort();
}

// A YAML parser's result: ok, or a message naming `file`:line:col.
template <typename Status>
void checkYamlVerdict(const Status& status, const std::string& file, const std::string& input) {
  if (status.ok()) return;
  static const std::regex where(std::regex_replace(file, std::regex(R"([.])"), R"(\.)") + R"(:\d+:\d+)");
  const std::string message(status.message());
  if (!std::regex_search(message, where)) finding("rejection without " + file + ":line:col: " + message, input);
}

}  // namespace hpac::fuzz
