#include "lockstep/distributed/store/detail/server_limits.h"

#include <fmt/format.h>

namespace lockstep::distributed::store_limits {

ConnectionCounter::ConnectionCounter(size_t max_total, size_t max_per_address)
    : max_total_(max_total), max_per_address_(max_per_address) {}

std::optional<std::string> ConnectionCounter::admit(const std::string& address) {
  if (total_ >= max_total_) {
    return fmt::format(
        "the store already serves {} connections, its limit "
        "(TcpStoreServerOptions::max_connections)",
        total_);
  }
  size_t& from_here = per_address_[address];
  if (from_here >= max_per_address_) {
    if (from_here == 0) per_address_.erase(address);  // a limit of 0: keep the map clean
    return fmt::format(
        "{} connections from {} are open, the most the store serves per address "
        "(TcpStoreServerOptions::max_connections_per_address)",
        from_here, address);
  }
  ++from_here;
  ++total_;
  return std::nullopt;
}

void ConnectionCounter::release(const std::string& address) {
  auto it = per_address_.find(address);
  if (it == per_address_.end()) return;
  if (--it->second == 0) per_address_.erase(it);
  --total_;
}

std::optional<uint64_t> RateLimitedLog::note(Clock::time_point now) {
  if (last_line_ && now - *last_line_ < interval_) {
    ++held_back_;
    return std::nullopt;
  }
  last_line_ = now;
  const uint64_t held = held_back_;
  held_back_ = 0;
  return held;
}

}  // namespace lockstep::distributed::store_limits
