#include "lockstep/collectives/debug_group.h"

#include <algorithm>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/forwarding_group.h"

namespace lockstep::collectives {
namespace {

// What a rank that destroyed its group publishes as its next call.
constexpr std::string_view kDestroyed = "nothing more: it destroyed its group";

class DebugGroup final : public ForwardingGroup {
 public:
  DebugGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<distributed::Store> store,
             std::string label)
      : ForwardingGroup(std::move(inner)), store_(std::move(store)), label_(std::move(label)) {
    LOCKSTEP_CHECK(store_ != nullptr, "desync checker for group '{}': a store is needed",
                   name());
    if (label_.empty()) label_ = fmt::format("group '{}' ({})", name(), backend());
    // Counts this rank's groups of this name, so that a group made again under
    // an old name does not read the previous one's fingerprints.
    const int64_t instance = store_->add(fmt::format("{}/desync/instances/{}", name(), rank()), 1);
    prefix_ = fmt::format("{}/desync/{}/", name(), instance);
  }

  // The others' next collective reads this rank's part at once, rather than
  // waiting out its timeout for a call that will never come.
  ~DebugGroup() override {
    const std::string after =
        last_seq_ == 0 ? std::string("before any collective")
                       : fmt::format("after collective #{}", last_seq_);
    try {
      store_->set(key(last_seq_ + 1, rank()), fmt::format("{} {}", kDestroyed, after));
    } catch (const std::exception&) {
      // The store is gone too (the job is ending): nobody is left to tell.
    }
  }

 protected:
  void before_collective(const Call& call) override { check_same(call); }

 private:
  std::string key(uint64_t seq, int rank) const { return fmt::format("{}{}/{}", prefix_, seq, rank); }
  std::string last_key(int rank) const { return fmt::format("{}last/{}", prefix_, rank); }

  void check_same(const Call& call);
  [[noreturn]] void throw_missing(uint64_t seq, const std::string& fingerprint,
                                  std::chrono::milliseconds timeout);

  std::shared_ptr<distributed::Store> store_;
  std::string label_;  // "group 'default' (gloo)", or a subgroup's with its parent's ranks
  std::string prefix_;
  uint64_t last_seq_ = 0;  // the last collective checked
};

// Publish, wait for every rank's fingerprint of the same call, compare.
// Deleting this rank's key of call seq-2 is safe: every rank has published
// seq-1, so every rank has finished reading seq-2.
void DebugGroup::check_same(const Call& call) {
  const uint64_t seq = call.signature.seq;
  const std::string fingerprint = call.signature.text();
  const std::chrono::milliseconds t = call.timeout;
  last_seq_ = seq;
  store_->set(key(seq, rank()), fingerprint);
  store_->set(last_key(rank()), fmt::format("collective #{}: {}", seq, fingerprint));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(key(seq, r));
  try {
    store_->wait(keys, t);
  } catch (const distributed::StoreTimeout&) {
    throw_missing(seq, fingerprint, t);
  }
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of first rank
  for (int r = 0; r < size(); ++r) {
    const std::string theirs = store_->get_string(keys[static_cast<size_t>(r)]);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == theirs; });
    if (it == groups.end()) {
      groups.push_back({theirs, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (seq > 2) store_->delete_key(key(seq - 2, rank()));
  if (groups.size() == 1) return;
  // A rank that destroyed its group is usually ending (see kLeftGroupGrace).
  if (std::any_of(groups.begin(), groups.end(),
                  [](const auto& g) { return g.first.rfind(kDestroyed, 0) == 0; })) {
    std::this_thread::sleep_for(kLeftGroupGrace);
  }
  std::vector<std::string> parts;
  for (const auto& [call, ranks] : groups) {
    parts.push_back(fmt::format("{} called {}", ranks_text(ranks), call));
  }
  throw CollectiveError(fmt::format(
      "collective #{} differs across ranks of {}: {} (seen on rank {}). Every rank must issue "
      "the same collectives, with the same dtype and element count, in the same order",
      seq, label_, fmt::join(parts, "; "), rank()));
}

void DebugGroup::throw_missing(uint64_t seq, const std::string& fingerprint,
                               std::chrono::milliseconds timeout) {
  const auto present = [&](const std::string& k) {
    try {
      store_->wait({k}, std::chrono::milliseconds(1));
      return true;
    } catch (const distributed::StoreTimeout&) {
      return false;
    }
  };
  std::vector<int> missing;
  std::vector<std::string> lasts;
  for (int r = 0; r < size(); ++r) {
    if (present(key(seq, r))) continue;
    missing.push_back(r);
    lasts.push_back(present(last_key(r))
                        ? fmt::format("rank {}'s last recorded call was {}", r,
                                      store_->get_string(last_key(r)))
                        : fmt::format("rank {} has issued no collective on this group", r));
  }
  throw CollectiveError(fmt::format(
      "collective #{} ({}) on rank {} of {}: {} did not issue collective #{} within "
      "{:.3g} s ({}); it may have died, be stuck, or be running other code",
      seq, fingerprint, rank(), label_,
      missing.empty() ? std::string("some rank") : ranks_text(missing), seq,
      static_cast<double>(timeout.count()) / 1000.0, fmt::join(lasts, "; ")));
}

}  // namespace

std::shared_ptr<ProcessGroup> make_debug_group(std::shared_ptr<ProcessGroup> inner,
                                               std::shared_ptr<distributed::Store> store,
                                               std::string label) {
  LOCKSTEP_CHECK(inner != nullptr, "make_debug_group: the group to wrap is null");
  return std::make_shared<DebugGroup>(std::move(inner), std::move(store), std::move(label));
}

}  // namespace lockstep::collectives
