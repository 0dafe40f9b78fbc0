// PrefixStore: a view of another store in which every key is "<prefix>/<key>",
// so that several process groups (or subsystems) share one store without
// their keys colliding.
#pragma once

#include <memory>
#include <string>

#include "lockstep/distributed/store/store.h"

namespace lockstep::distributed {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  // Counts the keys of the whole underlying store, not only this prefix's.
  int64_t num_keys() override;

  using Store::set;
  using Store::wait;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::string full_key(const std::string& key) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace lockstep::distributed
