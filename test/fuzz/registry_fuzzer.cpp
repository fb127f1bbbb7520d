// libFuzzer target: the model registry parser (tools/trainer/registry.cpp over
// yaml_reader.cpp). Seeds: fuzz/corpus/registry.
#include "test/fuzz/fuzz_common.h"
#include "tools/trainer/registry.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    hpac::fuzz::checkYamlVerdict(hpac::trainer::parseRegistry(text, "fuzz.yaml").status(), "fuzz.yaml", text);
  } catch (const std::exception& e) {
    hpac::fuzz::finding(std::string("exception escaped parseRegistry: ") + e.what(), text);
  }
  return 0;
}
