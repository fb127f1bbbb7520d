// hpac/policy/byte_size.h
//
// Byte sizes as people write and read them: the one grammar every front end
// parses (the trainer YAML and the dict hpac.hf checks, `python -m hpac plan
// --memory-target`, hpac.fit_memory_target's strings through
// torch.ops.hpac.parse_memory_target) and the one formatter every message and
// report prints with (C++ and, through torch.ops.hpac.format_bytes, Python).
//
// Note [One size grammar]
// A size is a decimal number and a binary unit, nothing else:
//     DIGITS [ "." DIGITS ] UNIT        UNIT: B, KiB, MiB, GiB or TiB
// "70GiB", "1.5GiB", "512MiB", "4096B". Not sizes: no unit ("1000": a plain
// number, which memory_budget reads as a fraction), decimal units ("70GB":
// named as the unit it has), an exponent ("1e3GiB"), a sign ("-5MiB": named as
// negative), spaces, "nan" or "inf". The bytes are the number times the unit,
// rounded down. Python's int is already bytes and needs no unit.
#pragma once

#include <cstdint>
#include <string>

namespace hpac {

// What parseByteSize found; kOk with bytes set, else what is wrong with the text.
enum class ByteSizeError { kOk, kNotASize, kPlainNumber, kUnknownUnit, kNegative, kTooLarge };

struct ByteSize {
  ByteSizeError error = ByteSizeError::kNotASize;
  int64_t bytes = 0;   // kOk
  double number = 0;   // kPlainNumber, kOk: the number as written
  std::string unit;    // kUnknownUnit: the unit as written
};

// Note [One size grammar]. Never throws.
ByteSize parseByteSize(const std::string& text);

// "'70GB' has unit 'GB'", "'lots' is not a size", ...: what is wrong with `text` (parsed), without "allowed"; empty
// for kOk. A plain number is "'1000' is a plain number".
std::string byteSizeProblem(const std::string& text, const ByteSize& parsed);

// The memory target's reading of a size (bytes with a unit, > 0): bytes, or -1 with *error set to the problem and
// what is allowed (kMemoryTargetAllowed).
int64_t parseMemoryTarget(const std::string& text, std::string* error);
extern const char* const kMemoryTargetAllowed;

// "512 B", "3.5 KiB", "12.34 MiB", "70.000 GiB": the largest unit the size (either sign) reaches.
std::string formatBytes(int64_t bytes);

}  // namespace hpac
