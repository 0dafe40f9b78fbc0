// What TcpStoreServer holds back: how many connections it serves per peer
// address and in total, and how often it repeats a warning.
//
// Internal to distributed/store. Both classes belong to the server's loop thread
// and are not thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace lockstep::distributed::store_limits {

// Counts open connections per peer address (an IP, without the port) and in
// total, and decides whether one more may open.
class ConnectionCounter {
 public:
  ConnectionCounter(size_t max_total, size_t max_per_address);

  // Counts the connection from `address` in and returns nullopt, or counts
  // nothing and returns why it is refused: a sentence for the client and the
  // log, naming the limit and the option that sets it.
  std::optional<std::string> admit(const std::string& address);
  // Once for every admitted connection, when it closes.
  void release(const std::string& address);

  size_t total() const { return total_; }

 private:
  size_t max_total_;
  size_t max_per_address_;
  size_t total_ = 0;
  std::unordered_map<std::string, size_t> per_address_;
};

// Lets a repeated warning through at most once per `interval` and counts the
// occurrences held back in between, so that a condition that recurs every few
// milliseconds (accept() failing with EMFILE) costs one line per interval.
class RateLimitedLog {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RateLimitedLog(Clock::duration interval) : interval_(interval) {}

  // Counts one occurrence at `now`. When a line is due, returns how many
  // occurrences were held back since the previous line (0 for the first);
  // otherwise nullopt.
  std::optional<uint64_t> note(Clock::time_point now);

  Clock::duration interval() const { return interval_; }

 private:
  Clock::duration interval_;
  std::optional<Clock::time_point> last_line_;
  uint64_t held_back_ = 0;
};

}  // namespace lockstep::distributed::store_limits
