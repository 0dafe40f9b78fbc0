// Fuzz target for the store's frame parser (distributed/store/detail/protocol.h).
//
// Each input is split into chunks (sizes taken from its first byte) and fed to
// a FrameParser with a small size limit, the way the server feeds it socket
// reads; like the server, which admits only a small AUTH frame before a client
// has authenticated, the limit starts smaller and is raised after the first
// frame. Every frame that comes out is re-encoded and must parse back to the
// same frame. Crashes, hangs, sanitizer reports and failed checks are bugs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "lockstep/distributed/store/detail/protocol.h"

namespace proto = lockstep::distributed::store_protocol;

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

void check_round_trip(const proto::Frame& frame) {
  std::vector<std::string_view> fields(frame.fields.begin(), frame.fields.end());
  const auto bytes = proto::encode_frame(frame.type, fields);
  proto::FrameParser parser(1u << 16);
  parser.feed(bytes.data(), bytes.size());
  proto::Frame again;
  require(parser.next(again) == proto::FrameParser::Status::Frame);
  require(again.type == frame.type && again.fields == frame.fields);
  require(!parser.mid_frame());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 16;
  ++data;
  --size;
  proto::FrameParser parser(64);  // raised to 4096 after the first frame
  proto::Frame frame;
  size_t offset = 0;
  while (offset < size) {
    const size_t n = size - offset < chunk ? size - offset : chunk;
    parser.feed(data + offset, n);
    offset += n;
    while (true) {
      const auto status = parser.next(frame);
      if (status == proto::FrameParser::Status::NeedMore) break;
      if (status == proto::FrameParser::Status::Error) {
        require(parser.error() != proto::ParseError::None && !parser.message().empty());
        return 0;
      }
      check_round_trip(frame);
      parser.set_max_body_bytes(4096);
    }
  }
  return 0;
}
