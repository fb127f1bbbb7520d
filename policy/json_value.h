// hpac/policy/json_value.h
//
// JSON read and written by hpac's own C++ (the step record, policy/step_record.h): a value tree that keeps what it
// read — object members in their order, numbers as their text — so that a document read and written again is the
// same document. The writer is policy/text_format.h's jsonString for strings; nothing else in the tree parses JSON
// in C++ but the trainer's config library, which reads it as YAML (tools/trainer/route_plan_json.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpac {

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  JsonValue() = default;
  static JsonValue boolean(bool b);
  static JsonValue number(int64_t n);
  static JsonValue number(double d);  // as "%.17g"; NaN and infinities are not JSON: written as null
  static JsonValue string(std::string s);
  static JsonValue array();
  static JsonValue object();

  Kind kind() const { return kind_; }
  const char* kindName() const;  // "null", "a boolean", "a number", "a string", "an array", "an object"
  bool isInteger() const;        // a number written without fraction or exponent that fits int64
  bool asBool() const { return bool_; }
  int64_t asInt() const;          // isInteger() only
  double asDouble() const;        // any number
  const std::string& asString() const { return text_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }
  const JsonValue* find(const std::string& key) const;  // nullptr when absent (or not an object)

  void push(JsonValue v) { items_.push_back(std::move(v)); }
  void set(const std::string& key, JsonValue v);  // replaces a member of that name, else appends

  // Compact, members in order: {"a": 1, "b": [true, null]}.
  std::string dump() const;

 private:
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  std::string text_;  // a string's text, or a number's literal
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
  friend class JsonParser;
};

// Parses `text` (RFC 8259: one value, UTF-8 passed through, \u escapes decoded, nesting to depth 64). Throws
// c10::Error "SOURCE: not JSON at line L, column C: what" for anything else. Never reads past the text.
JsonValue parseJson(const std::string& text, const std::string& source);

}  // namespace hpac
