#include "lockstep/collectives/gloo/gloo_store_adapter.h"

namespace lockstep::collectives::gloo_backend {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<distributed::Store> store, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {
  if (prefix_.empty() || prefix_.back() != '/') prefix_ += '/';
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(full_key(key), distributed::Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  // Wait first with our timeout: the store's own get timeout may be longer.
  store_->wait({full_key(key)}, timeout_);
  const distributed::Bytes value = store_->get(full_key(key));
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(full_key(key));
  store_->wait(full, timeout);
}

}  // namespace lockstep::collectives::gloo_backend
