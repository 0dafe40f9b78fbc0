// The TcpStore wire protocol: frame encoding and an incremental frame parser.
//
// Internal to distributed/store (the server, the client and the fuzz target use it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::distributed::store_protocol {

/*
 * Frame format. Every message, request or reply, is one frame:
 *
 *   offset  size  field
 *   0       4     magic: the bytes "LKS1" (the digit is the protocol version)
 *   4       1     type (MessageType below)
 *   5       4     body length in bytes, uint32 little-endian
 *   9       n     body: zero or more fields, back to back, filling it exactly;
 *                 a field is a uint32 little-endian length and that many bytes
 *
 * Integers inside fields (timeouts, deltas, counts) are int64 little-endian,
 * exactly 8 bytes. Each type has a fixed shape (kSpecs in protocol.cpp), which
 * the parser checks, so the server and client only see well-formed frames.
 *
 *   request        fields                              reply
 *   AUTH           token                               OK max_body | ERROR (then close)
 *   SET            key, value                          OK
 *   GET            key, timeout_ms                     OK value | TIMEOUT key
 *   ADD            key, delta                          OK new_value | ERROR
 *   COMPARE_SET    key, expected, desired              OK value_after
 *   WAIT           timeout_ms, key...                  OK | TIMEOUT missing_key...
 *   DELETE         key                                 OK existed (0 or 1)
 *   NUM_KEYS       -                                   OK count
 *
 * The first frame of a connection must be AUTH. Until the server has
 * accepted it, a connection may send only a few KiB in all (the server's
 * max_unauthenticated_bytes, never less than its own AUTH frame); a larger
 * frame closes it. A server that will not serve a new connection (too many
 * open) answers ERROR "busy: <why>" in place of the AUTH reply and closes: the
 * client may retry later. Any other ERROR reply to AUTH is final. The OK
 * reply to AUTH carries the largest frame body the server takes (an int64):
 * a client refuses a bigger request itself, with an error that says so,
 * rather than send it and have the server drop the connection.
 *
 * One request is outstanding per connection: the client sends the next
 * request after the reply. GET and WAIT carry the client's timeout; the server
 * answers TIMEOUT when it passes, so a client that gave up never finds a stale
 * reply on its connection.
 */

inline constexpr char kMagic[4] = {'L', 'K', 'S', '1'};
inline constexpr size_t kHeaderBytes = 9;
// Bounds the per-frame bookkeeping whatever the body size (a WAIT on more
// keys than this is refused as too large).
inline constexpr size_t kMaxFields = 65536;
// How an ERROR reply to AUTH starts when the server is too busy to serve the
// connection (not a refused token): the client retries those.
inline constexpr std::string_view kBusyPrefix = "busy: ";

enum class MessageType : uint8_t {
  Auth = 1,
  Set = 2,
  Get = 3,
  Add = 4,
  CompareSet = 5,
  Wait = 6,
  Delete = 7,
  NumKeys = 8,
  // replies
  Ok = 64,
  Error = 65,
  Timeout = 66,
};

const char* type_name(MessageType type);

struct Frame {
  MessageType type = MessageType::Ok;
  std::vector<std::string> fields;  // binary-safe
};

// Appends one encoded frame to `out`.
void append_frame(std::vector<uint8_t>& out, MessageType type,
                  const std::vector<std::string_view>& fields);
std::vector<uint8_t> encode_frame(MessageType type, const std::vector<std::string_view>& fields);
// Appends all of a frame of one field but that field's `field_bytes` bytes,
// which the caller sends next (a big value sent without a copy).
void append_frame_head(std::vector<uint8_t>& out, MessageType type, size_t field_bytes);

std::string encode_i64(int64_t value);
// `field` must be 8 bytes (the parser guarantees it for integer fields).
int64_t decode_i64(std::string_view field);

enum class ParseError {
  None,
  BadMagic,        // not a lockstep store frame (garbage, another protocol)
  UnknownType,     // a type byte no request or reply has
  TooLarge,        // body over the size limit, or too many fields
  TruncatedField,  // a field's length runs past the end of the body
  BadFields,       // wrong number of fields for the type, or an int not 8 bytes
};

const char* parse_error_name(ParseError error);

// Incremental parser: feed() it byte chunks as they arrive (any split), then
// call next() until it returns NeedMore. After an error it stays in error;
// the connection is beyond repair. Buffers at most one header plus one body
// (max_body_bytes) beyond what next() has consumed, plus the last chunk fed.
class FrameParser {
 public:
  enum class Status { Frame, NeedMore, Error };

  explicit FrameParser(uint32_t max_body_bytes);

  // Applies from the next frame's header on (the server raises it once a
  // client has authenticated).
  void set_max_body_bytes(uint32_t max_body_bytes) { max_body_bytes_ = max_body_bytes; }

  void feed(const void* data, size_t size);
  // Frame: `out` holds the next frame. Error: see error() and message().
  Status next(Frame& out);

  ParseError error() const { return error_; }
  // What was wrong, for logs: e.g. "body of 80000000 bytes exceeds the 67108864-byte limit".
  const std::string& message() const { return message_; }
  // True when bytes of an incomplete frame are buffered (a disconnect now
  // would cut a frame).
  bool mid_frame() const { return buffer_.size() > consumed_; }
  // Memory held for input, consumed or not (the buffer's capacity).
  size_t buffered_bytes() const { return buffer_.capacity(); }

 private:
  Status fail(ParseError error, std::string message);

  uint32_t max_body_bytes_;
  std::vector<uint8_t> buffer_;
  size_t consumed_ = 0;  // bytes of buffer_ already returned as frames
  ParseError error_ = ParseError::None;
  std::string message_;
};

// Counters (add) are stored as the decimal text of an int64, so get() on a
// counter reads e.g. "42". Returns the counter's new text, or nullopt when
// `current` is not such a text or the sum overflows int64 (*error says which).
std::optional<std::string> add_to_counter(const std::string* current, int64_t delta,
                                          int64_t* result, std::string* error);

}  // namespace lockstep::distributed::store_protocol
