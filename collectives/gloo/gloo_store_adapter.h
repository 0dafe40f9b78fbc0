// Our distributed::Store seen through gloo's rendezvous::Store interface, with
// every key under a prefix, so gloo's rendezvous keys ("0", "1", ...) of one
// group do not collide with another group's or with our own keys.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives::gloo_backend {

class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  // `timeout`: how long wait() without a timeout and get() wait for a key.
  GlooStoreAdapter(std::shared_ptr<distributed::Store> store, std::string prefix,
                   std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::string full_key(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<distributed::Store> store_;
  std::string prefix_;  // ends with '/'
  std::chrono::milliseconds timeout_;
};

}  // namespace lockstep::collectives::gloo_backend
