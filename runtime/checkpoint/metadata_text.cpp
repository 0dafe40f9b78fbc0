#include "lockstep/runtime/checkpoint/metadata_text.h"

#include <charconv>

#include <fmt/format.h>

namespace lockstep::runtime {

std::string metadata_number(double value) { return fmt::format("{:.17g}", value); }

std::optional<double> parse_metadata_number(std::string_view text) {
  // std::from_chars, not std::stod: strtod reports a subnormal result as a
  // range error, and accepts leading spaces, hex floats and a '+'.
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || stop != end) return std::nullopt;
  return value;
}

size_t utf8_prefix_length(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // no overlong forms
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // no overlong forms
      if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char b = s[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return i;
    }
    i += len;
  }
  return n;
}

std::string escape_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t good = utf8_prefix_length(text);
    for (const char c : text.substr(0, good)) {
      if (c == '\\') out += '\\';
      out += c;
    }
    if (good == text.size()) break;
    out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[good]));
    text.remove_prefix(good + 1);
  }
  return out;
}

std::optional<std::string> unescape_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '\\') {
      out += '\\';
      ++i;
      continue;
    }
    unsigned value = 0;
    if (i + 3 >= text.size() || text[i + 1] != 'x') return std::nullopt;
    const char* first = text.data() + i + 2;
    const auto [stop, ec] = std::from_chars(first, first + 2, value, 16);
    if (ec != std::errc() || stop != first + 2) return std::nullopt;
    out += static_cast<char>(value);
    i += 3;
  }
  return out;
}

}  // namespace lockstep::runtime
