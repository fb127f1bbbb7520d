#include "policy/json_value.h"

#include "policy/text_format.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace hpac {

JsonValue JsonValue::boolean(bool b) {
  JsonValue v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

JsonValue JsonValue::number(int64_t n) {
  JsonValue v;
  v.kind_ = Kind::kNumber;
  v.text_ = std::to_string(n);
  return v;
}

JsonValue JsonValue::number(double d) {
  if (!std::isfinite(d)) return JsonValue();
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", d);
  JsonValue v;
  v.kind_ = Kind::kNumber;
  v.text_ = buf;
  return v;
}

JsonValue JsonValue::string(std::string s) {
  JsonValue v;
  v.kind_ = Kind::kString;
  v.text_ = std::move(s);
  return v;
}

JsonValue JsonValue::array() {
  JsonValue v;
  v.kind_ = Kind::kArray;
  return v;
}

JsonValue JsonValue::object() {
  JsonValue v;
  v.kind_ = Kind::kObject;
  return v;
}

const char* JsonValue::kindName() const {
  switch (kind_) {
    case Kind::kNull: return "null";
    case Kind::kBool: return "a boolean";
    case Kind::kNumber: return isInteger() ? "an integer" : "a number";
    case Kind::kString: return "a string";
    case Kind::kArray: return "an array";
    case Kind::kObject: return "an object";
  }
  return "?";
}

bool JsonValue::isInteger() const {
  if (kind_ != Kind::kNumber || text_.find_first_of(".eE") != std::string::npos) return false;
  errno = 0;
  (void)std::strtoll(text_.c_str(), nullptr, 10);
  return errno != ERANGE;
}

int64_t JsonValue::asInt() const {
  TORCH_INTERNAL_ASSERT(isInteger(), "JsonValue::asInt on ", kindName());
  return std::strtoll(text_.c_str(), nullptr, 10);
}

double JsonValue::asDouble() const {
  TORCH_INTERNAL_ASSERT(kind_ == Kind::kNumber, "JsonValue::asDouble on ", kindName());
  return std::strtod(text_.c_str(), nullptr);
}

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& [name, value] : members_) {
    if (name == key) return &value;
  }
  return nullptr;
}

void JsonValue::set(const std::string& key, JsonValue v) {
  for (auto& [name, value] : members_) {
    if (name == key) {
      value = std::move(v);
      return;
    }
  }
  members_.emplace_back(key, std::move(v));
}

std::string JsonValue::dump() const {
  switch (kind_) {
    case Kind::kNull: return "null";
    case Kind::kBool: return bool_ ? "true" : "false";
    case Kind::kNumber: return text_;
    case Kind::kString: return jsonString(text_);
    case Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < items_.size(); ++i) out += (i ? ", " : "") + items_[i].dump();
      return out + "]";
    }
    case Kind::kObject: {
      std::string out = "{";
      for (size_t i = 0; i < members_.size(); ++i) {
        out += (i ? ", " : "") + jsonString(members_[i].first) + ": " + members_[i].second.dump();
      }
      return out + "}";
    }
  }
  return "null";
}

// One pass over the text, recursive descent; every error names where it stopped.
class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  JsonValue document() {
    JsonValue v = value(0);
    space();
    if (i_ != s_.size()) fail("text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    int64_t line = 1, column = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    TORCH_CHECK(false, source_, ": not JSON at line ", line, ", column ", column, ": ", what);
  }

  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }

  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }

  JsonValue value(int depth) {
    if (depth > 64) fail("nested deeper than 64");
    space();
    if (i_ >= s_.size()) fail("the text ended where a value was expected");
    const char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return JsonValue::string(string());
    if (literal("true")) return JsonValue::boolean(true);
    if (literal("false")) return JsonValue::boolean(false);
    if (literal("null")) return JsonValue();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected '") + c + "'");
  }

  JsonValue object(int depth) {
    JsonValue v = JsonValue::object();
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return v;
    }
    while (true) {
      space();
      if (i_ >= s_.size() || s_[i_] != '"') fail("expected a member name in quotes");
      std::string key = string();
      space();
      if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':' after a member name");
      ++i_;
      JsonValue member = value(depth + 1);
      if (v.find(key) != nullptr) fail("member '" + key + "' given twice");
      v.members_.emplace_back(std::move(key), std::move(member));
      space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  JsonValue array(int depth) {
    JsonValue v = JsonValue::array();
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return v;
    }
    while (true) {
      v.items_.push_back(value(depth + 1));
      space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  JsonValue number() {
    const size_t begin = i_;
    if (s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !digit(s_[i_])) fail("a number needs a digit");
    if (s_[i_] == '0') {
      ++i_;
    } else {
      while (i_ < s_.size() && digit(s_[i_])) ++i_;
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !digit(s_[i_])) fail("a fraction needs a digit");
      while (i_ < s_.size() && digit(s_[i_])) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !digit(s_[i_])) fail("an exponent needs a digit");
      while (i_ < s_.size() && digit(s_[i_])) ++i_;
    }
    JsonValue v;
    v.kind_ = JsonValue::Kind::kNumber;
    v.text_ = s_.substr(begin, i_ - begin);
    if (!std::isfinite(std::strtod(v.text_.c_str(), nullptr))) fail("number " + v.text_ + " is out of range");
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("a \\u escape needs four hex digits");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      u <<= 4;
      if (c >= '0' && c <= '9') {
        u |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        u |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        u |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("a \\u escape needs four hex digits");
      }
    }
    return u;
  }

  static void utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("a string is not closed");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("a string is not closed");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("a high surrogate without its low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xD800 && cp < 0xE000) {
            fail("a lone surrogate");
          }
          utf8(cp, out);
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }

  const std::string& s_;
  const std::string& source_;
  size_t i_ = 0;
};

JsonValue parseJson(const std::string& text, const std::string& source) { return JsonParser(text, source).document(); }

}  // namespace hpac
