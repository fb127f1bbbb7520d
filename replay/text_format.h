// hpac/replay/text_format.h
//
// The few text formatters hpac's messages and JSON writers share (explain's
// JSON, the trainer's config ops and route plans, its error messages):
//   jsonString       a string as a JSON string literal
//   jsonStringList   strings as a JSON array of string literals
//   joinNames        names as "a, b, c", for messages ("allowed: ...")
// Here, in the lowest folder that writes JSON, so that every user may include
// it (docs/design.md, "The map").
#pragma once

#include <string>
#include <vector>

namespace hpac {

// `s` as a JSON string literal, quotes included: `"`, `\` and control
// characters escaped; other bytes (UTF-8 included) as they are.
std::string jsonString(const std::string& s);

// ["a", "b"]: each item through jsonString; [] for none.
std::string jsonStringList(const std::vector<std::string>& items);

// "a, b, c"; "" for none.
std::string joinNames(const std::vector<std::string>& names);

}  // namespace hpac
