// policy/byte_size.h: Note [One size grammar] and the one byte formatter.
#include "policy/byte_size.h"

#include <gtest/gtest.h>

namespace hpac {
namespace {

TEST(ByteSize, ReadsNumbersWithABinaryUnit) {
  EXPECT_EQ(parseByteSize("70GiB").bytes, 70LL << 30);
  EXPECT_EQ(parseByteSize("1.5GiB").bytes, 3LL << 29);
  EXPECT_EQ(parseByteSize("512MiB").bytes, 512LL << 20);
  EXPECT_EQ(parseByteSize("4096B").bytes, 4096);
  EXPECT_EQ(parseByteSize("2TiB").bytes, 2LL << 40);
  EXPECT_EQ(parseByteSize("0.5KiB").bytes, 512);
  EXPECT_EQ(parseByteSize("70GiB").error, ByteSizeError::kOk);
}

TEST(ByteSize, NamesWhatIsWrong) {
  const std::pair<const char*, ByteSizeError> bad[] = {
      {"1000", ByteSizeError::kPlainNumber}, {"0.5", ByteSizeError::kPlainNumber},
      {"70GB", ByteSizeError::kUnknownUnit}, {"64MB", ByteSizeError::kUnknownUnit},
      {"-5MiB", ByteSizeError::kNegative},   {"-0.25", ByteSizeError::kNegative},
      {"1e3GiB", ByteSizeError::kNotASize},  {"1 GiB", ByteSizeError::kNotASize},
      {" 1GiB", ByteSizeError::kNotASize},   {"1GiB ", ByteSizeError::kNotASize},
      {"nan", ByteSizeError::kNotASize},     {".inf", ByteSizeError::kNotASize},
      {"", ByteSizeError::kNotASize},        {"1.GiB", ByteSizeError::kNotASize},
      {"lots", ByteSizeError::kNotASize},    {"99999999999TiB", ByteSizeError::kTooLarge}};
  for (const auto& [text, error] : bad) EXPECT_EQ(parseByteSize(text).error, error) << text;
  EXPECT_EQ(byteSizeProblem("70GB", parseByteSize("70GB")), "'70GB' has unit 'GB'");
  EXPECT_EQ(byteSizeProblem("lots", parseByteSize("lots")), "'lots' is not a size");
}

TEST(ByteSize, AMemoryTargetIsBytesWithAUnitAboveZero) {
  std::string error;
  EXPECT_EQ(parseMemoryTarget("8GiB", &error), 8LL << 30);
  EXPECT_EQ(parseMemoryTarget("0GiB", &error), -1);
  EXPECT_EQ(error, std::string("'0GiB' is zero bytes; ") + kMemoryTargetAllowed);
  EXPECT_EQ(parseMemoryTarget("1000", &error), -1);
  EXPECT_NE(error.find("'1000' is a plain number; the target is bytes with a unit"), std::string::npos) << error;
}

TEST(ByteSize, FormatsInTheLargestUnitReached) {
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(3584), "3.5 KiB");
  EXPECT_EQ(formatBytes(12LL << 20), "12.00 MiB");
  EXPECT_EQ(formatBytes(70LL << 30), "70.000 GiB");
  EXPECT_EQ(formatBytes(-(3LL << 20)), "-3.00 MiB");
}

}  // namespace
}  // namespace hpac
