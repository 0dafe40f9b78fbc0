#include "launcher/program_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "launcher/options.h"
#include "lockstep/runtime/error.h"

namespace lockstep::launcher {
namespace {

// Binds `port` (0: the kernel's choice) on every address of `store_host`'s
// family and releases it: the port bound, or -1 with errno set. With
// SO_REUSEADDR, as a store server (PyTorch's TCPStore) binds: a connection
// of the last job's rank 0 in TIME_WAIT there does not hold the port.
int bind_and_release(const std::string& store_host, int port) {
  const bool ipv6 = store_host.find(':') != std::string::npos;
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  LOCKSTEP_CHECK(fd >= 0, "lockstep-run: cannot open a socket to find a free port for "
                 "MASTER_PORT: {}", std::strerror(errno));
  const int on = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (ipv6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof *a;
  }
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  close(fd);
  errno = err;
  if (!bound) return -1;
  return ntohs(ipv6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

int free_program_port(const std::string& store_host) {
  const int port = bind_and_release(store_host, 0);
  LOCKSTEP_CHECK(port > 0, "lockstep-run: cannot find a free port for MASTER_PORT: {}",
                 std::strerror(errno));
  return port;
}

int chosen_program_port(const std::string& store_host, int port) {
  if (bind_and_release(store_host, port) < 0)
    throw UsageError(fmt::format("-x MASTER_PORT={}: the program's rank 0 could not serve its "
                                 "store there: {}; choose another port, or leave -x "
                                 "MASTER_PORT out for a free one",
                                 port, std::strerror(errno)));
  return port;
}

}  // namespace lockstep::launcher
