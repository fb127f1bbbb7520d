// The text formatters of policy/text_format.h: JSON string literals and
// arrays, and the comma-separated name lists of messages.
#include "policy/text_format.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hpac {
namespace {

TEST(TextFormat, JsonStringEscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(jsonString(""), "\"\"");
  EXPECT_EQ(jsonString("a \"b\" \\c"), "\"a \\\"b\\\" \\\\c\"");
  EXPECT_EQ(jsonString("1\n2\t3\r"), "\"1\\n2\\t3\\r\"");
  EXPECT_EQ(jsonString(std::string("x\x01y", 3)), "\"x\\u0001y\"");
  EXPECT_EQ(jsonString("µs"), "\"µs\"");  // UTF-8 passes as it is
}

TEST(TextFormat, JsonStringListQuotesEachItem) {
  EXPECT_EQ(jsonStringList({}), "[]");
  EXPECT_EQ(jsonStringList({"mlp"}), "[\"mlp\"]");
  EXPECT_EQ(jsonStringList({"a", "", "b\"c"}), "[\"a\", \"\", \"b\\\"c\"]");
}

TEST(TextFormat, JoinNamesSeparatesWithCommas) {
  EXPECT_EQ(joinNames({}), "");
  EXPECT_EQ(joinNames({"off"}), "off");
  EXPECT_EQ(joinNames({"off", "full", "selective"}), "off, full, selective");
}

}  // namespace
}  // namespace hpac
