#include "launcher/program_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::launcher {

int free_program_port(const std::string& store_host) {
  const bool ipv6 = store_host.find(':') != std::string::npos;
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  LOCKSTEP_CHECK(fd >= 0, "lockstep-run: cannot open a socket to find a free port for "
                 "MASTER_PORT: {}", std::strerror(errno));
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (ipv6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof *a;
  }
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  close(fd);
  LOCKSTEP_CHECK(bound, "lockstep-run: cannot find a free port for MASTER_PORT: {}",
                 std::strerror(err));
  return ntohs(ipv6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace lockstep::launcher
