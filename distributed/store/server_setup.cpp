#include "lockstep/distributed/store/detail/server_setup.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/open_files.h"

namespace lockstep::distributed::store_setup {

void make_room_for_clients(uint32_t expected_clients) {
  if (expected_clients == 0) return;
  // A connection each, and the server's own: its listening socket, epoll
  // and eventfd, with room for a client that reconnects before its old
  // connection is closed.
  const long needed = static_cast<long>(expected_clients) + 8;
  const runtime::OpenFileRoom room = runtime::make_room_for_descriptors(needed);
  LOCKSTEP_CHECK(room.enough,
                 "TcpStoreServer: {} clients need about {} more open files, but {} or start "
                 "fewer ranks",
                 expected_clients, needed, runtime::room_shortfall(room));
}

ListeningSocket listen_on(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string where = fmt::format("{}:{}", host, port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                             &hints, &found);
  LOCKSTEP_CHECK(rc == 0,
                 "TcpStoreServer: cannot resolve the listen address {}: {}; give an "
                 "IP address or a resolvable host name",
                 where, gai_strerror(rc));
  ListeningSocket listening;
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr && listening.fd < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      listening.fd = fd;
    } else {
      last_error = strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  LOCKSTEP_CHECK(listening.fd >= 0,
                 "TcpStoreServer: cannot listen on {}: {}; choose another port "
                 "(or port 0 for any free one)",
                 where, last_error);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(listening.fd, reinterpret_cast<sockaddr*>(&addr), &len);
  listening.port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return listening;
}

}  // namespace lockstep::distributed::store_setup
