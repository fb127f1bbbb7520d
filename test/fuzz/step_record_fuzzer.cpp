// libFuzzer target: the step record's reader (policy/step_record.cpp over policy/json_value.cpp), what hpac.hf reads
// a plan file with. Any input is read, or refused with c10::Error naming the record; one read is written and read
// back as the same text. Seeds: fuzz/corpus/step_record.
#include "policy/step_record.h"
#include "test/fuzz/fuzz_common.h"

#include <c10/util/Exception.h>

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const hpac::StepRecord record = hpac::readStepRecord(text, "fuzz.json");
    const std::string written = hpac::stepRecordJson(record);
    if (hpac::stepRecordJson(hpac::readStepRecord(written, "again.json")) != written) {
      hpac::fuzz::finding("a record written and read back differs", text);
    }
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).rfind("hpac: step record ", 0) != 0) {
      hpac::fuzz::finding(std::string("a refusal that does not name the record: ") + e.what_without_backtrace(), text);
    }
  } catch (const std::exception& e) {
    hpac::fuzz::finding(std::string("exception escaped readStepRecord: ") + e.what(), text);
  }
  return 0;
}
