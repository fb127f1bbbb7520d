#include "policy/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace hpac {

const char* const kMemoryTargetAllowed =
    "allowed: the most tensor bytes one rank may hold during a step, > 0, with a unit: B, KiB, MiB, GiB or TiB "
    "(70GiB)";

namespace {

int64_t unitBytes(const std::string& unit) {
  if (unit == "B") return 1;
  if (unit == "KiB") return int64_t{1} << 10;
  if (unit == "MiB") return int64_t{1} << 20;
  if (unit == "GiB") return int64_t{1} << 30;
  if (unit == "TiB") return int64_t{1} << 40;
  return 0;
}

bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

}  // namespace

ByteSize parseByteSize(const std::string& text) {
  ByteSize out;
  size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  const size_t digits = i;
  while (i < text.size() && isDigit(text[i])) ++i;
  if (i == digits) return out;  // no leading digit: "lots", ".5GiB", "nan", " 1GiB"
  if (i < text.size() && text[i] == '.') {
    const size_t fraction = ++i;
    while (i < text.size() && isDigit(text[i])) ++i;
    if (i == fraction) return out;  // "1.GiB"
  }
  out.number = std::strtod(text.substr(digits, i - digits).c_str(), nullptr);
  out.unit = text.substr(i);
  if (out.unit.empty()) {
    out.error = negative ? ByteSizeError::kNegative : ByteSizeError::kPlainNumber;
    if (negative) out.number = -out.number;
    return out;
  }
  for (const char c : out.unit) {
    if (!std::isalpha(static_cast<unsigned char>(c))) return out;  // "1e3GiB", "1 GiB", "5MiB!"
  }
  const int64_t unit = unitBytes(out.unit);
  if (unit == 0) {
    out.error = ByteSizeError::kUnknownUnit;
    return out;
  }
  if (negative) {
    out.error = ByteSizeError::kNegative;
    return out;
  }
  const double bytes = std::floor(out.number * static_cast<double>(unit));
  if (!(bytes <= static_cast<double>(std::numeric_limits<int64_t>::max() / 2))) {
    out.error = ByteSizeError::kTooLarge;
    return out;
  }
  out.bytes = static_cast<int64_t>(bytes);
  out.error = ByteSizeError::kOk;
  return out;
}

std::string byteSizeProblem(const std::string& text, const ByteSize& parsed) {
  const std::string quoted = "'" + text + "'";
  switch (parsed.error) {
    case ByteSizeError::kOk: return "";
    case ByteSizeError::kNotASize: return quoted + " is not a size";
    case ByteSizeError::kPlainNumber: return quoted + " is a plain number";
    case ByteSizeError::kUnknownUnit: return quoted + " has unit '" + parsed.unit + "'";
    case ByteSizeError::kNegative: return quoted + " is negative";
    case ByteSizeError::kTooLarge: return quoted + " is too large";
  }
  return quoted + " is not a size";
}

int64_t parseMemoryTarget(const std::string& text, std::string* error) {
  const ByteSize size = parseByteSize(text);
  std::string problem = byteSizeProblem(text, size);
  if (size.error == ByteSizeError::kPlainNumber) {
    problem += "; the target is bytes with a unit (a fraction is memory_budget's)";
  } else if (size.error == ByteSizeError::kOk && size.bytes <= 0) {
    problem = "'" + text + "' is zero bytes";
  }
  if (problem.empty()) return size.bytes;
  if (error != nullptr) *error = problem + "; " + kMemoryTargetAllowed;
  return -1;
}

std::string formatBytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  const int64_t size = bytes < 0 ? -bytes : bytes;
  if (size >= (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.3f GiB", b / (1 << 30));
  } else if (size >= (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1 << 20));
  } else if (size >= (int64_t{1} << 10)) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / (1 << 10));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

}  // namespace hpac
