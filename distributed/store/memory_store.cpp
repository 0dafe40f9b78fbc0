#include "lockstep/distributed/store/memory_store.h"

#include <algorithm>

#include <fmt/format.h>

#include "lockstep/distributed/store/detail/protocol.h"

namespace lockstep::distributed {

namespace {

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

}  // namespace

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

Bytes MemoryStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard lock(mutex_);
  auto it = data_.find(key);
  // Deleted between the wait and here: as if it had never appeared in time.
  if (it == data_.end()) {
    throw StoreTimeout(
        fmt::format("MemoryStore: key '{}' was deleted while get() waited for it", key));
  }
  return it->second;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    std::string current;
    if (it != data_.end()) current = to_string(it->second);
    std::string error;
    auto text = store_protocol::add_to_counter(it == data_.end() ? nullptr : &current, delta,
                                               &result, &error);
    LOCKSTEP_CHECK(text.has_value(), "MemoryStore: add({}) on key '{}': {}", delta, key, error);
    data_[key] = to_bytes(*text);
  }
  changed_.notify_all();
  return result;
}

Bytes MemoryStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  std::unique_lock lock(mutex_);
  auto it = data_.find(key);
  const bool matches = it == data_.end() ? expected.empty() : it->second == expected;
  if (!matches) return it == data_.end() ? Bytes{} : it->second;
  data_[key] = desired;
  lock.unlock();
  changed_.notify_all();
  return desired;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  // now + milliseconds::max() would overflow the clock; a century is forever enough.
  timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365 * 100));
  std::unique_lock lock(mutex_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (data_.find(key) == data_.end()) return false;
    }
    return true;
  };
  if (!changed_.wait_for(lock, timeout, all_present)) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (data_.find(key) == data_.end()) missing.push_back(key);
    }
    throw StoreTimeout(fmt::format(
        "MemoryStore: timed out after {} ms waiting for key(s) {} (missing: {}); the rank "
        "that should set them may have failed or be slower than the timeout",
        timeout.count(), quoted_list(keys), quoted_list(missing)));
  }
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  return data_.erase(key) > 0;
}

int64_t MemoryStore::num_keys() {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

}  // namespace lockstep::distributed
