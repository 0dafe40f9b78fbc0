#include "lockstep/distributed/store/detail/protocol.h"

#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace lockstep::distributed::store_protocol {

namespace {

// The shape of each message type: how many fields, and which one (if any) is
// an int64.
struct Spec {
  MessageType type;
  size_t min_fields;
  size_t max_fields;
  int int_field;  // -1: none
};

constexpr Spec kSpecs[] = {
    {MessageType::Auth, 1, 1, -1},
    {MessageType::Set, 2, 2, -1},
    {MessageType::Get, 2, 2, 1},
    {MessageType::Add, 2, 2, 1},
    {MessageType::CompareSet, 3, 3, -1},
    {MessageType::Wait, 1, kMaxFields, 0},
    {MessageType::Delete, 1, 1, -1},
    {MessageType::NumKeys, 0, 0, -1},
    {MessageType::Ok, 0, kMaxFields, -1},
    {MessageType::Error, 1, 1, -1},
    {MessageType::Timeout, 0, kMaxFields, -1},
};

const Spec* find_spec(uint8_t type) {
  for (const Spec& spec : kSpecs) {
    if (static_cast<uint8_t>(spec.type) == type) return &spec;
  }
  return nullptr;
}

// Input buffer capacity a parser keeps between frames; more is released.
constexpr size_t kKeepCapacity = 1u << 20;

uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void store_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

const char* type_name(MessageType type) {
  switch (type) {
    case MessageType::Auth: return "AUTH";
    case MessageType::Set: return "SET";
    case MessageType::Get: return "GET";
    case MessageType::Add: return "ADD";
    case MessageType::CompareSet: return "COMPARE_SET";
    case MessageType::Wait: return "WAIT";
    case MessageType::Delete: return "DELETE";
    case MessageType::NumKeys: return "NUM_KEYS";
    case MessageType::Ok: return "OK";
    case MessageType::Error: return "ERROR";
    case MessageType::Timeout: return "TIMEOUT";
  }
  return "?";
}

const char* parse_error_name(ParseError error) {
  switch (error) {
    case ParseError::None: return "none";
    case ParseError::BadMagic: return "bad magic";
    case ParseError::UnknownType: return "unknown message type";
    case ParseError::TooLarge: return "frame too large";
    case ParseError::TruncatedField: return "truncated field";
    case ParseError::BadFields: return "bad fields";
  }
  return "?";
}

void append_frame(std::vector<uint8_t>& out, MessageType type,
                  const std::vector<std::string_view>& fields) {
  size_t body = 0;
  for (std::string_view f : fields) body += 4 + f.size();
  out.reserve(out.size() + kHeaderBytes + body);
  out.insert(out.end(), kMagic, kMagic + 4);
  out.push_back(static_cast<uint8_t>(type));
  store_u32(out, static_cast<uint32_t>(body));
  for (std::string_view f : fields) {
    store_u32(out, static_cast<uint32_t>(f.size()));
    out.insert(out.end(), f.begin(), f.end());
  }
}

void append_frame_head(std::vector<uint8_t>& out, MessageType type, size_t field_bytes) {
  out.insert(out.end(), kMagic, kMagic + 4);
  out.push_back(static_cast<uint8_t>(type));
  store_u32(out, static_cast<uint32_t>(4 + field_bytes));
  store_u32(out, static_cast<uint32_t>(field_bytes));
}

std::vector<uint8_t> encode_frame(MessageType type, const std::vector<std::string_view>& fields) {
  std::vector<uint8_t> out;
  append_frame(out, type, fields);
  return out;
}

std::string encode_i64(int64_t value) {
  std::string out(8, '\0');
  const auto u = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(u >> (8 * i));
  return out;
}

int64_t decode_i64(std::string_view field) {
  uint64_t u = 0;
  for (size_t i = 0; i < 8 && i < field.size(); ++i) {
    u |= static_cast<uint64_t>(static_cast<uint8_t>(field[i])) << (8 * i);
  }
  return static_cast<int64_t>(u);
}

FrameParser::FrameParser(uint32_t max_body_bytes) : max_body_bytes_(max_body_bytes) {}

void FrameParser::feed(const void* data, size_t size) {
  if (error_ != ParseError::None || size == 0) return;
  if (consumed_ > 0) {  // drop the frames already handed out
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  // One big frame must not pin its memory for the rest of the connection.
  if (buffer_.empty() && buffer_.capacity() > kKeepCapacity) std::vector<uint8_t>().swap(buffer_);
  const auto* bytes = static_cast<const uint8_t*>(data);
  buffer_.insert(buffer_.end(), bytes, bytes + size);
}

FrameParser::Status FrameParser::fail(ParseError error, std::string message) {
  error_ = error;
  message_ = std::move(message);
  buffer_.clear();
  buffer_.shrink_to_fit();
  consumed_ = 0;
  return Status::Error;
}

FrameParser::Status FrameParser::next(Frame& out) {
  if (error_ != ParseError::None) return Status::Error;
  const uint8_t* p = buffer_.data() + consumed_;
  const size_t available = buffer_.size() - consumed_;

  // The header is checked as soon as its bytes are here, before waiting for
  // the body, so garbage and oversized frames are refused without buffering.
  if (available == 0) return Status::NeedMore;
  const size_t magic_bytes = available < 4 ? available : 4;
  if (std::memcmp(p, kMagic, magic_bytes) != 0) {
    std::string hex;
    for (size_t i = 0; i < magic_bytes; ++i) hex += fmt::format("{:02x}", p[i]);
    return fail(ParseError::BadMagic,
                fmt::format("bad magic: first bytes 0x{} are not \"LKS1\" (not a lockstep "
                            "store client, or the stream lost its framing)",
                            hex));
  }
  if (available < 5) return Status::NeedMore;
  const Spec* spec = find_spec(p[4]);
  if (spec == nullptr) {
    return fail(ParseError::UnknownType, fmt::format("unknown message type {}", p[4]));
  }
  if (available < kHeaderBytes) return Status::NeedMore;
  const uint32_t body_bytes = load_u32(p + 5);
  if (body_bytes > max_body_bytes_) {
    return fail(ParseError::TooLarge,
                fmt::format("{} frame body of {} bytes exceeds the {}-byte limit",
                            type_name(spec->type), body_bytes, max_body_bytes_));
  }
  if (available - kHeaderBytes < body_bytes) return Status::NeedMore;

  out.type = spec->type;
  out.fields.clear();
  const uint8_t* body = p + kHeaderBytes;
  size_t offset = 0;
  while (offset < body_bytes) {
    if (out.fields.size() == spec->max_fields) {
      return fail(
          spec->max_fields == kMaxFields ? ParseError::TooLarge : ParseError::BadFields,
          fmt::format("{} frame has more than {} fields", type_name(spec->type), spec->max_fields));
    }
    if (body_bytes - offset < 4) {
      return fail(ParseError::TruncatedField,
                  fmt::format("{} frame: field {} has a cut length prefix ({} of 4 bytes left "
                              "in the body)",
                              type_name(spec->type), out.fields.size(), body_bytes - offset));
    }
    const uint32_t length = load_u32(body + offset);
    offset += 4;
    if (length > body_bytes - offset) {
      return fail(
          ParseError::TruncatedField,
          fmt::format("{} frame: field {} claims {} bytes but only {} remain in the body",
                      type_name(spec->type), out.fields.size(), length, body_bytes - offset));
    }
    out.fields.emplace_back(reinterpret_cast<const char*>(body + offset), length);
    offset += length;
  }
  if (out.fields.size() < spec->min_fields) {
    return fail(ParseError::BadFields,
                fmt::format("{} frame has {} fields, needs at least {}", type_name(spec->type),
                            out.fields.size(), spec->min_fields));
  }
  if (spec->int_field >= 0 && out.fields[spec->int_field].size() != 8) {
    return fail(
        ParseError::BadFields,
        fmt::format("{} frame: field {} must be an 8-byte int64, has {} bytes",
                    type_name(spec->type), spec->int_field, out.fields[spec->int_field].size()));
  }
  consumed_ += kHeaderBytes + body_bytes;
  return Status::Frame;
}

std::optional<std::string> add_to_counter(const std::string* current, int64_t delta,
                                          int64_t* result, std::string* error) {
  int64_t value = 0;
  if (current != nullptr) {
    const char* first = current->data();
    const char* last = first + current->size();
    auto [end, ec] = std::from_chars(first, last, value);
    if (ec != std::errc() || end != last || current->empty()) {
      *error =
          "its value is not the decimal text of an int64 (was the key set with set()? "
          "use a key of its own for a counter)";
      return std::nullopt;
    }
  }
  if (__builtin_add_overflow(value, delta, result)) {
    *error = fmt::format("{} + {} overflows int64", value, delta);
    return std::nullopt;
  }
  return std::to_string(*result);
}

}  // namespace lockstep::distributed::store_protocol
