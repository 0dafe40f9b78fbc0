// distributed::Store: the key-value store the ranks of a job rendezvous through
// (addresses, the NCCL unique id, desync diagnosis).
//
// Keys are strings, values are byte strings. Every implementation is safe to
// use from several threads. A call that waits (get, wait) gives up after its
// timeout with StoreTimeout naming the keys and, for a remote store, the
// address.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/runtime/error.h"

namespace lockstep::distributed {

using Bytes = std::vector<uint8_t>;

Bytes to_bytes(std::string_view text);
std::string to_string(const Bytes& bytes);

// A wait (get, wait) or a connection that ran past its timeout.
class StoreTimeout : public Error {
 public:
  using Error::Error;
};

// A StoreTimeout in which the server gave no answer at all: no connection
// within the connect timeout, or no reply to a request within its timeout
// and a grace. Unlike a key that has not come yet, waiting on will not help
// when it repeats: its host is down or its process stopped.
class StoreUnreachable : public StoreTimeout {
 public:
  using StoreTimeout::StoreTimeout;
};

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(5);

  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any earlier value.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The value of `key`; blocks until it exists or timeout() passes.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the int64 stored at `key` (a missing key counts as 0) and
  // returns the new value. Atomic across all clients.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` when its current value equals `expected`; a
  // missing key matches an empty `expected`. Returns the value after the call
  // (`desired` when the swap happened, the current value otherwise).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Blocks until every key exists or `timeout` passes (then StoreTimeout).
  virtual void wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) = 0;
  // Removes `key`; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // The number of keys in the store (all prefixes together).
  virtual int64_t num_keys() = 0;

  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  void set(const std::string& key, std::string_view value) { set(key, to_bytes(value)); }
  std::string get_string(const std::string& key) { return to_string(get(key)); }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
};

}  // namespace lockstep::distributed
