// Text in checkpoint metadata: numbers written so that they read back to the
// same bits and read back by one parser, and the UTF-8 that a safetensors
// header's JSON strings must be.
//
//   c.metadata["lr"] = metadata_number(lr);                // "0.001", "5e-310", "nan"
//   std::optional<double> lr = parse_metadata_number(text);  // nullopt: not a number
//
// Values that are bytes rather than text (a path with a Latin-1 byte is a
// legal Linux path) go through escape_bytes(), which keeps them whole in
// valid UTF-8, and back through unescape_bytes().
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace lockstep::runtime {

// Text that reads back to the same double ("{:.17g}": 17 digits), NaN and
// infinities included ("nan", "inf", "-inf").
std::string metadata_number(double value);

// The whole of `text` as a double, as metadata_number() writes it: decimal
// or exponent form, "nan", "inf", "-inf"; subnormal numbers included (which
// std::stod refuses as out of range). nullopt for anything else: an empty
// text, leading or trailing characters, a value past a double's range.
std::optional<double> parse_metadata_number(std::string_view text);

// How many leading bytes of `text` are well-formed UTF-8 (no overlong forms,
// no surrogates, nothing above U+10FFFF): text.size() when all are.
size_t utf8_prefix_length(std::string_view text);
inline bool is_utf8(std::string_view text) { return utf8_prefix_length(text) == text.size(); }

// `text` as valid UTF-8 that keeps every byte: well-formed UTF-8 sequences
// stay as they are, every other byte becomes "\xHH" (two lowercase hex
// digits) and every backslash "\\". Also fit to show bytes in a message.
std::string escape_bytes(std::string_view text);
// escape_bytes() undone; nullopt when `text` holds a backslash followed by
// anything but a backslash or "x" and two hex digits.
std::optional<std::string> unescape_bytes(std::string_view text);

}  // namespace lockstep::runtime
