#pragma once
// A minimal JSON writer for the doctor probe's one-line report: objects,
// arrays, strings, integers and booleans, written in order, compact, with
// ", " and ": " separators. Strings are escaped per RFC 8259 (quote,
// backslash, control characters; bytes >= 0x80 pass through, so UTF-8 stays
// UTF-8). Not a general-purpose library: the caller writes well-formed
// structure (every Begin has its End).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace tessera::rdma {

inline std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

class JsonLine {
 public:
  JsonLine& BeginObject(const char* key = nullptr) { return Open(key, '{'); }
  JsonLine& EndObject() { return Close('}'); }
  JsonLine& BeginArray(const char* key = nullptr) { return Open(key, '['); }
  JsonLine& EndArray() { return Close(']'); }
  JsonLine& String(const char* key, const std::string& value) { return Raw(key, JsonQuote(value)); }
  JsonLine& Int(const char* key, int64_t value) { return Raw(key, std::to_string(value)); }
  JsonLine& Uint(const char* key, uint64_t value) { return Raw(key, std::to_string(value)); }
  JsonLine& Bool(const char* key, bool value) { return Raw(key, value ? "true" : "false"); }
  const std::string& text() const { return out_; }

 private:
  void Separate(const char* key) {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ", ";
      first_.back() = false;
    }
    if (key != nullptr) {
      out_ += JsonQuote(key);
      out_ += ": ";
    }
  }
  JsonLine& Open(const char* key, char bracket) {
    Separate(key);
    out_ += bracket;
    first_.push_back(true);
    return *this;
  }
  JsonLine& Close(char bracket) {
    out_ += bracket;
    first_.pop_back();
    return *this;
  }
  JsonLine& Raw(const char* key, const std::string& value) {
    Separate(key);
    out_ += value;
    return *this;
  }

  std::string out_;
  std::vector<bool> first_;
};

}  // namespace tessera::rdma
