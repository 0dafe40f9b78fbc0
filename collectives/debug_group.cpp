#include "lockstep/collectives/debug_group.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace lockstep::collectives {
namespace {

// "rank 1", "ranks 0 and 2", "ranks 0, 1 and 3".
std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  const std::vector<int> head(ranks.begin(), ranks.end() - 1);
  return fmt::format("ranks {} and {}", fmt::join(head, ", "), ranks.back());
}

class DebugGroup final : public ProcessGroup {
 public:
  DebugGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<runtime::Store> store)
      : ProcessGroup(inner->rank(), inner->size(), inner->name(), inner->timeout()),
        inner_(std::move(inner)),
        store_(std::move(store)) {
    LOCKSTEP_CHECK(store_ != nullptr, "desync checker for group '{}': a store is needed",
                   name());
    // Counts this rank's groups of this name, so that a group made again under
    // an old name does not read the previous one's fingerprints.
    const int64_t instance = store_->add(fmt::format("{}/desync/instances/{}", name(), rank()), 1);
    prefix_ = fmt::format("{}/desync/{}/", name(), instance);
  }

  std::string backend() const override { return inner_->backend(); }

  std::shared_ptr<SharedTensorPool> reserve_shared_pool(size_t bytes) override {
    return inner_->reserve_shared_pool(bytes);
  }

  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts) override {
    check_tensor("allreduce", tensor);
    check_same(call("allreduce", tensor, to_string(opts.op)), opts.timeout);
    return inner_->allreduce(tensor, opts);
  }
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts) override {
    check_tensor("broadcast", tensor);
    check_same(call("broadcast", tensor, fmt::format("root {}", opts.root)), opts.timeout);
    return inner_->broadcast(tensor, opts);
  }
  std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& opts) override {
    check_tensor("reduce", tensor);
    check_same(call("reduce", tensor, fmt::format("{}, root {}", to_string(opts.op), opts.root)),
               opts.timeout);
    return inner_->reduce(tensor, opts);
  }
  std::shared_ptr<Work> allgather(Tensor& output, const Tensor& input,
                                  const AllgatherOptions& opts) override {
    check_tensor("allgather", input);
    check_same(call("allgather", input, ""), opts.timeout);
    return inner_->allgather(output, input, opts);
  }
  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                       const ReduceScatterOptions& opts) override {
    check_tensor("reduce_scatter", output);
    check_same(call("reduce_scatter", output, to_string(opts.op)), opts.timeout);
    return inner_->reduce_scatter(output, input, opts);
  }
  std::shared_ptr<Work> barrier(const BarrierOptions& opts) override {
    check_same("barrier()", opts.timeout);
    return inner_->barrier(opts);
  }
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, const SendRecvOptions& opts) override {
    return inner_->send(tensor, dst, opts);
  }
  std::shared_ptr<Work> recv(Tensor& tensor, int src, const SendRecvOptions& opts) override {
    return inner_->recv(tensor, src, opts);
  }

 private:
  // The fingerprint: "allreduce(f32, 1000 elements, sum)".
  static std::string call(std::string_view op, const Tensor& t, std::string_view extra) {
    return fmt::format("{}({}, {} elements{}{})", op, runtime::dtype_name(t.dtype()), t.numel(),
                       extra.empty() ? "" : ", ", extra);
  }
  std::string key(uint64_t seq, int rank) const { return fmt::format("{}{}/{}", prefix_, seq, rank); }
  std::string last_key(int rank) const { return fmt::format("{}last/{}", prefix_, rank); }

  void check_same(const std::string& fingerprint, const Timeout& timeout);
  [[noreturn]] void throw_missing(uint64_t seq, const std::string& fingerprint,
                                  std::chrono::milliseconds timeout);

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<runtime::Store> store_;
  std::string prefix_;
};

// Publish, wait for every rank's fingerprint of the same call, compare.
// Deleting this rank's key of call seq-2 is safe: every rank has published
// seq-1, so every rank has finished reading seq-2.
void DebugGroup::check_same(const std::string& fingerprint, const Timeout& timeout) {
  const uint64_t seq = next_seq();
  const std::chrono::milliseconds t = timeout_of(timeout);
  store_->set(key(seq, rank()), fingerprint);
  store_->set(last_key(rank()), fmt::format("collective #{}: {}", seq, fingerprint));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(key(seq, r));
  try {
    store_->wait(keys, t);
  } catch (const runtime::StoreTimeout&) {
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
  std::vector<std::string> parts;
  for (const auto& [call, ranks] : groups) {
    parts.push_back(fmt::format("{} called {}", ranks_text(ranks), call));
  }
  throw CollectiveError(fmt::format(
      "collective #{} differs across ranks of group '{}' ({}, seen on rank {}): {}. Every rank "
      "must issue the same collectives, with the same dtype and element count, in the same "
      "order",
      seq, name(), backend(), rank(), fmt::join(parts, "; ")));
}

void DebugGroup::throw_missing(uint64_t seq, const std::string& fingerprint,
                               std::chrono::milliseconds timeout) {
  const auto present = [&](const std::string& k) {
    try {
      store_->wait({k}, std::chrono::milliseconds(1));
      return true;
    } catch (const runtime::StoreTimeout&) {
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
      "collective #{} ({}) on rank {} of group '{}' ({}): {} did not issue collective #{} within "
      "{:.3g} s ({}); it may have died, be stuck, or be running other code",
      seq, fingerprint, rank(), name(), backend(),
      missing.empty() ? std::string("some rank") : ranks_text(missing), seq,
      static_cast<double>(timeout.count()) / 1000.0, fmt::join(lasts, "; ")));
}

}  // namespace

std::shared_ptr<ProcessGroup> make_debug_group(std::shared_ptr<ProcessGroup> inner,
                                               std::shared_ptr<runtime::Store> store) {
  LOCKSTEP_CHECK(inner != nullptr, "make_debug_group: the group to wrap is null");
  return std::make_shared<DebugGroup>(std::move(inner), std::move(store));
}

}  // namespace lockstep::collectives
