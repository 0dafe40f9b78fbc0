// The store's frame encoder and incremental parser: round trips, any chunking,
// and each kind of malformed input.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "lockstep/distributed/store/detail/protocol.h"

namespace proto = lockstep::distributed::store_protocol;
using proto::FrameParser;
using proto::MessageType;
using proto::ParseError;

namespace {

std::vector<uint8_t> raw(std::string_view text) { return {text.begin(), text.end()}; }

// A hand-built header: magic, type byte, body length.
std::vector<uint8_t> header(uint8_t type, uint32_t body_bytes, const char* magic = "LKS1") {
  std::vector<uint8_t> out(magic, magic + 4);
  out.push_back(type);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(body_bytes >> (8 * i)));
  return out;
}

void append_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Feeds all of `bytes` at once and returns the status of the first next().
FrameParser::Status parse_one(const std::vector<uint8_t>& bytes, proto::Frame& frame,
                              FrameParser& parser) {
  parser.feed(bytes.data(), bytes.size());
  return parser.next(frame);
}

ParseError error_of(const std::vector<uint8_t>& bytes, uint32_t limit = 1024) {
  FrameParser parser(limit);
  proto::Frame frame;
  auto status = parse_one(bytes, frame, parser);
  if (status != FrameParser::Status::Error) return ParseError::None;
  CHECK_FALSE(parser.message().empty());
  // Sticky: the parser stays in error.
  CHECK(parser.next(frame) == FrameParser::Status::Error);
  return parser.error();
}

}  // namespace

TEST_CASE("store protocol: frames round-trip through the parser", "[store]") {
  const std::string binary("a\0b\xff", 4);
  const std::string minus_five = proto::encode_i64(-5), thousand = proto::encode_i64(1000);
  const std::vector<std::pair<MessageType, std::vector<std::string_view>>> frames = {
      {MessageType::Auth, {"token"}},
      {MessageType::Set, {"key", binary}},
      {MessageType::Set, {"", ""}},
      {MessageType::Get, {"key", minus_five}},
      {MessageType::Wait, {thousand, "a", "b", "c"}},
      {MessageType::NumKeys, {}},
      {MessageType::Ok, {}},
      {MessageType::Timeout, {"x", "y"}},
  };
  std::vector<uint8_t> stream;
  for (const auto& [type, fields] : frames) proto::append_frame(stream, type, fields);

  FrameParser parser(1 << 20);
  parser.feed(stream.data(), stream.size());
  proto::Frame frame;
  for (const auto& [type, fields] : frames) {
    REQUIRE(parser.next(frame) == FrameParser::Status::Frame);
    CHECK(frame.type == type);
    REQUIRE(frame.fields.size() == fields.size());
    for (size_t i = 0; i < fields.size(); ++i) CHECK(frame.fields[i] == fields[i]);
  }
  CHECK(parser.next(frame) == FrameParser::Status::NeedMore);
  CHECK_FALSE(parser.mid_frame());
}

TEST_CASE("store protocol: a frame head and its field sent apart make the whole frame",
          "[store]") {
  const std::string value("big\0value", 9);
  std::vector<uint8_t> out;
  proto::append_frame_head(out, MessageType::Ok, value.size());
  out.insert(out.end(), value.begin(), value.end());
  CHECK(out == proto::encode_frame(MessageType::Ok, {value}));
}

TEST_CASE("store protocol: int64 fields encode little-endian and round-trip", "[store]") {
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{-1}, INT64_MAX, INT64_MIN, int64_t{1} << 40}) {
    CHECK(proto::decode_i64(proto::encode_i64(v)) == v);
  }
  CHECK(proto::encode_i64(0x0102) == std::string("\x02\x01\0\0\0\0\0\0", 8));
}

TEST_CASE("store protocol: frames fed byte by byte come out whole", "[store]") {
  std::vector<uint8_t> stream;
  proto::append_frame(stream, MessageType::CompareSet, {"k", "old", "new"});
  const size_t first_frame_bytes = stream.size();
  proto::append_frame(stream, MessageType::Delete, {"k"});

  FrameParser parser(1024);
  proto::Frame frame;
  std::vector<proto::Frame> got;
  for (size_t i = 0; i < stream.size(); ++i) {
    parser.feed(&stream[i], 1);
    while (true) {
      auto status = parser.next(frame);
      REQUIRE(status != FrameParser::Status::Error);
      if (status == FrameParser::Status::NeedMore) break;
      got.push_back(frame);
    }
    // Mid-frame exactly when the bytes fed so far end inside a frame.
    const bool at_boundary = i + 1 == stream.size() || i + 1 == first_frame_bytes;
    CHECK(parser.mid_frame() == !at_boundary);
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0].type == MessageType::CompareSet);
  CHECK(got[0].fields == std::vector<std::string>{"k", "old", "new"});
  CHECK(got[1].type == MessageType::Delete);
  CHECK(got[1].fields == std::vector<std::string>{"k"});
}

TEST_CASE("store protocol: garbage is refused as bad magic at once", "[store]") {
  CHECK(error_of(raw("GET /index.html HTTP/1.1\r\n")) == ParseError::BadMagic);
  // One wrong byte is enough; no need to wait for a whole header.
  CHECK(error_of(raw("X")) == ParseError::BadMagic);
  CHECK(error_of(header(1, 0, "LKS2")) == ParseError::BadMagic);
}

TEST_CASE("store protocol: unknown message types are refused", "[store]") {
  CHECK(error_of(header(0, 0)) == ParseError::UnknownType);
  CHECK(error_of(header(9, 0)) == ParseError::UnknownType);
  CHECK(error_of(header(255, 0)) == ParseError::UnknownType);
}

TEST_CASE("store protocol: a body over the limit is refused from its header", "[store]") {
  // Only the header is sent: the parser must not wait for 4 GiB.
  CHECK(error_of(header(2, 0xffffffffu)) == ParseError::TooLarge);
  CHECK(error_of(header(2, 1025), 1024) == ParseError::TooLarge);
  // Exactly at the limit is fine (here: incomplete, so NeedMore).
  CHECK(error_of(header(2, 1024), 1024) == ParseError::None);
}

TEST_CASE("store protocol: field lengths running past the body are truncated fields", "[store]") {
  auto frame = header(static_cast<uint8_t>(MessageType::Set), 6);
  append_u32(frame, 100);  // claims 100 bytes, the body has 2 left
  frame.push_back('a');
  frame.push_back('b');
  CHECK(error_of(frame) == ParseError::TruncatedField);

  auto cut_prefix = header(static_cast<uint8_t>(MessageType::Delete), 2);
  cut_prefix.push_back(1);
  cut_prefix.push_back(0);  // half a length prefix
  CHECK(error_of(cut_prefix) == ParseError::TruncatedField);
}

TEST_CASE("store protocol: wrong field counts and int sizes are bad fields", "[store]") {
  CHECK(error_of(proto::encode_frame(MessageType::Set, {"only key"})) == ParseError::BadFields);
  CHECK(error_of(proto::encode_frame(MessageType::Auth, {"a", "b"})) == ParseError::BadFields);
  CHECK(error_of(proto::encode_frame(MessageType::NumKeys, {"x"})) == ParseError::BadFields);
  CHECK(error_of(proto::encode_frame(MessageType::Get, {"key", "1234"})) == ParseError::BadFields);
  CHECK(error_of(proto::encode_frame(MessageType::Wait, {})) == ParseError::BadFields);
}

TEST_CASE("store protocol: more fields than allowed is too large", "[store]") {
  std::vector<std::string_view> fields(proto::kMaxFields + 1, "");
  CHECK(error_of(proto::encode_frame(MessageType::Timeout, fields), 1u << 20) ==
        ParseError::TooLarge);
}

TEST_CASE("store protocol: a frame cut short waits for more and reports mid_frame", "[store]") {
  auto frame = proto::encode_frame(MessageType::Set, {"key", "value"});
  FrameParser parser(1024);
  proto::Frame out;
  parser.feed(frame.data(), frame.size() - 1);
  CHECK(parser.next(out) == FrameParser::Status::NeedMore);
  CHECK(parser.mid_frame());
  parser.feed(&frame.back(), 1);
  CHECK(parser.next(out) == FrameParser::Status::Frame);
  CHECK_FALSE(parser.mid_frame());
}

TEST_CASE("store protocol: a raised body limit applies from the next frame", "[store]") {
  // As the server does: a small limit until AUTH, then the full one.
  FrameParser parser(64);
  proto::Frame out;
  auto stream = proto::encode_frame(MessageType::Auth, {"token"});
  proto::append_frame(stream, MessageType::Set, {"key", std::string(1000, 'v')});
  parser.feed(stream.data(), stream.size());
  REQUIRE(parser.next(out) == FrameParser::Status::Frame);
  CHECK(out.type == MessageType::Auth);
  parser.set_max_body_bytes(4096);
  REQUIRE(parser.next(out) == FrameParser::Status::Frame);
  CHECK(out.fields.at(1).size() == 1000);

  FrameParser strict(64);
  strict.feed(stream.data(), stream.size());
  REQUIRE(strict.next(out) == FrameParser::Status::Frame);
  CHECK(strict.next(out) == FrameParser::Status::Error);
  CHECK(strict.error() == ParseError::TooLarge);
}

TEST_CASE("store protocol: a big frame's buffer is released once it is handed out", "[store]") {
  FrameParser parser(8u << 20);
  const auto big = proto::encode_frame(MessageType::Set, {"key", std::string(4u << 20, 'v')});
  parser.feed(big.data(), big.size());
  CHECK(parser.buffered_bytes() >= big.size());
  proto::Frame out;
  REQUIRE(parser.next(out) == FrameParser::Status::Frame);
  const auto small = proto::encode_frame(MessageType::NumKeys, {});
  parser.feed(small.data(), small.size());
  CHECK(parser.buffered_bytes() < (1u << 20));
  REQUIRE(parser.next(out) == FrameParser::Status::Frame);
  CHECK(out.type == MessageType::NumKeys);
}

TEST_CASE("store protocol: counters add as decimal text and refuse other values", "[store]") {
  int64_t result = 0;
  std::string error;
  CHECK(proto::add_to_counter(nullptr, 5, &result, &error) == std::optional<std::string>("5"));
  CHECK(result == 5);
  const std::string current = "-7";
  CHECK(proto::add_to_counter(&current, 2, &result, &error) == std::optional<std::string>("-5"));
  const std::string text = "hello";
  CHECK_FALSE(proto::add_to_counter(&text, 1, &result, &error).has_value());
  CHECK_THAT(error, Catch::Contains("not the decimal text"));
  const std::string max = std::to_string(INT64_MAX);
  CHECK_FALSE(proto::add_to_counter(&max, 1, &result, &error).has_value());
  CHECK_THAT(error, Catch::Contains("overflows"));
}
