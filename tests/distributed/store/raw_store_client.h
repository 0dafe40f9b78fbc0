// RawStoreClient: a plain TCP socket to a TcpStoreServer on loopback, for
// sending it whatever bytes a test likes (malformed frames, floods) and
// reading what comes back. Every wait is bounded (20 s), so a server that
// never answers fails the test instead of hanging it.
#pragma once

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/distributed/store/detail/protocol.h"

namespace lockstep::testing {

class RawStoreClient {
 public:
  // Connects to 127.0.0.1:port; `source` picks this end's address (any
  // 127.x.y.z is loopback on Linux), so tests can be several "peers".
  explicit RawStoreClient(uint16_t port, const char* source = nullptr) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    if (source != nullptr) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      REQUIRE(inet_pton(AF_INET, source, &local.sin_addr) == 1);
      REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawStoreClient() { close_now(); }
  RawStoreClient(const RawStoreClient&) = delete;
  RawStoreClient& operator=(const RawStoreClient&) = delete;

  // Sends what the server takes within 20 s; returns how many bytes that was.
  // The server may close on us meanwhile: that is not an error here.
  size_t send_bytes(const std::vector<uint8_t>& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n =
          ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};
        if (poll(&p, 1, 20000) <= 0) break;
        if (p.revents & (POLLERR | POLLHUP)) break;
        continue;
      }
      break;
    }
    return sent;
  }
  void send_frame(distributed::store_protocol::MessageType type,
                  const std::vector<std::string_view>& fields) {
    send_bytes(distributed::store_protocol::encode_frame(type, fields));
  }
  // The next frame the server sends, or nullopt when it closes or 20 s pass.
  std::optional<distributed::store_protocol::Frame> read_frame() {
    distributed::store_protocol::Frame frame;
    while (true) {
      auto status = parser_.next(frame);
      if (status == distributed::store_protocol::FrameParser::Status::Frame) return frame;
      if (status == distributed::store_protocol::FrameParser::Status::Error) return std::nullopt;
      char buffer[4096];
      const ssize_t n = read_some(buffer, sizeof buffer);
      if (n <= 0) return std::nullopt;
      parser_.feed(buffer, static_cast<size_t>(n));
    }
  }
  // True when the server closes the connection within 20 s (whatever it sent
  // before closing is read and dropped).
  bool closed_by_server() {
    char buffer[4096];
    while (true) {
      const ssize_t n = read_some(buffer, sizeof buffer);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      if (n < 0) return false;
    }
  }
  void close_now() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  ssize_t read_some(char* buffer, size_t size) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 20000) <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    return recv(fd_, buffer, size, 0);
  }

  int fd_ = -1;
  distributed::store_protocol::FrameParser parser_{1u << 20};
};

}  // namespace lockstep::testing
