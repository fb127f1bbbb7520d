// libFuzzer target: the op-name syntax of the save lists and op tables
// ('aten::mm' every overload, 'aten::max.dim' one, '.default' the empty
// overload) through saveListPolicy / resolveEntry (policy/). One entry per
// input line. A bad entry must be refused with a c10::Error naming it (an
// entry with bytes that are not printable ASCII: refused as such, shown
// escaped); any other exception, or a crash, is a finding.
// Seeds: fuzz/corpus/op_name.
#include "test/fuzz/fuzz_common.h"
#include "policy/checkpoint_policy.h"
#include "policy/op_tables.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <sstream>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> entries;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) entries.push_back(line);
  for (const std::string& entry : entries) {
    try {
      (void)hpac::resolveEntry(entry);
    } catch (const c10::Error& e) {
      const bool printable =
          std::all_of(entry.begin(), entry.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7f; });
      const std::string message = e.what_without_backtrace();  // as a C string: what a user sees
      if (message.find(printable ? "'" + entry + "'" : std::string("not printable ASCII")) == std::string::npos) {
        hpac::fuzz::finding("refusal that does not name the entry: " + message, text);
      }
    } catch (const std::exception& e) {
      hpac::fuzz::finding(std::string("exception escaped resolveEntry: ") + e.what(), text);
    }
  }
  try {
    (void)hpac::saveListPolicy(entries);
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("entry '") == std::string::npos) {
      hpac::fuzz::finding(std::string("save list refusal that names no entry: ") + e.what_without_backtrace(), text);
    }
  } catch (const std::exception& e) {
    hpac::fuzz::finding(std::string("exception escaped saveListPolicy: ") + e.what(), text);
  }
  return 0;
}
