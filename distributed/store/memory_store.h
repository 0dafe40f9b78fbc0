// MemoryStore: a Store held in this process's memory. For several "ranks" that
// are threads of one process (tests, single-process runs); blocking calls wait
// on a condition variable.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "lockstep/distributed/store/store.h"

namespace lockstep::distributed {

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  using Store::set;
  using Store::wait;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

}  // namespace lockstep::distributed
