// libFuzzer target: the trainer's YAML config parser (tools/trainer/config.cpp
// over yaml_reader.cpp). Seeds: fuzz/corpus/config.
#include "test/fuzz/fuzz_common.h"
#include "tools/trainer/config.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto config = hpac::trainer::parseConfig(text, "fuzz.yaml");
    hpac::fuzz::checkYamlVerdict(config.status(), "fuzz.yaml", text);
    if (config.ok()) (void)hpac::trainer::effectiveSummary(*config);
  } catch (const std::exception& e) {
    hpac::fuzz::finding(std::string("exception escaped parseConfig: ") + e.what(), text);
  }
  return 0;
}
