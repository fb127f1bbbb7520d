// hpac/policy/text_format.h
//
// The text formatters every hpac message and JSON writer shares (explain's
// JSON, the step target's report, the trainer's config ops and route plans,
// its error messages) — the only ones in the tree:
//   jsonString       a string as a JSON string literal
//   jsonStringList   strings as a JSON array of string literals
//   joinNames        names as "a, b, c", for messages ("allowed: ...")
// Byte sizes are policy/byte_size.h's. Here, in the lowest folder, so that
// every user may include it (docs/design.md, "The map").
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
