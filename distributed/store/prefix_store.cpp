#include "lockstep/distributed/store/prefix_store.h"

#include <utility>

namespace lockstep::distributed {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  LOCKSTEP_CHECK(inner_ != nullptr,
                 "PrefixStore(\"{}\"): the inner store is null; pass the "
                 "store to wrap",
                 prefix_);
  // Waits through this view honour its timeout; start from the inner one's.
  set_timeout(inner_->timeout());
}

std::string PrefixStore::full_key(const std::string& key) const { return prefix_ + "/" + key; }

void PrefixStore::set(const std::string& key, const Bytes& value) {
  inner_->set(full_key(key), value);
}

// The inner store's get() uses the inner timeout; go through wait() so that
// this view's timeout applies.
Bytes PrefixStore::get(const std::string& key) {
  const std::string full = full_key(key);
  inner_->wait({full}, timeout());
  return inner_->get(full);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(full_key(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return inner_->compare_set(full_key(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(full_key(key));
  inner_->wait(full, timeout);
}

bool PrefixStore::delete_key(const std::string& key) { return inner_->delete_key(full_key(key)); }

int64_t PrefixStore::num_keys() { return inner_->num_keys(); }

}  // namespace lockstep::distributed
