#include "lockstep/distributed/store/listen_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cctype>
#include <cstring>
#include <string_view>

namespace lockstep::distributed {
namespace {

bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
}

bool same_ip(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
}

bool is_local_interface(const sockaddr* address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next)
    found = i->ifa_addr != nullptr && same_ip(i->ifa_addr, address);
  freeifaddrs(list);
  return found;
}

std::string numeric(const sockaddr* a, socklen_t length) {
  char text[NI_MAXHOST] = {};
  if (getnameinfo(a, length, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return text;
}

}  // namespace

std::string listen_host_for(const std::string& host, bool clients_on_this_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  bool any_ipv4 = false;
  std::string chosen;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0) {
    for (addrinfo* a = found; a != nullptr && chosen.empty(); a = a->ai_next) {
      if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
      any_ipv4 = any_ipv4 || a->ai_family == AF_INET;
      const bool usable = is_loopback(a->ai_addr) ? clients_on_this_host
                                                  : is_local_interface(a->ai_addr);
      if (usable) chosen = numeric(a->ai_addr, a->ai_addrlen);
    }
    freeaddrinfo(found);
  } else {
    any_ipv4 = host.find(':') == std::string::npos;
  }
  if (!chosen.empty()) return chosen;
  return any_ipv4 ? "0.0.0.0" : "::";
}

bool names_loopback(const std::string& host) {
  std::string lower = host;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "localhost" || lower == "localhost.") return true;
  sockaddr_storage address{};  // room for either family
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  v4->sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1)
    return is_loopback(reinterpret_cast<const sockaddr*>(&address));
  const std::string bare = host.size() > 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  v6->sin6_family = AF_INET6;
  return inet_pton(AF_INET6, bare.c_str(), &v6->sin6_addr) == 1 &&
         is_loopback(reinterpret_cast<const sockaddr*>(&address));
}

bool loopback_interface_up() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return true;  // unknown: claim nothing about `lo`
  bool up = false;
  for (ifaddrs* i = list; i != nullptr && !up; i = i->ifa_next)
    up = (i->ifa_flags & IFF_LOOPBACK) != 0 && (i->ifa_flags & IFF_UP) != 0;
  freeifaddrs(list);
  return up;
}

std::string first_interface_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || is_loopback(a->ifa_addr))
      continue;
    found = numeric(a->ifa_addr, sizeof(sockaddr_in));
  }
  freeifaddrs(list);
  return found;
}

}  // namespace lockstep::distributed
