#include "lockstep/nn/join.h"

#include <bit>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/rank_text.h"
#include "lockstep/nn/ddp/replica_sync.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/stable_hash.h"

namespace lockstep::nn {
namespace {

using runtime::Batch;
using runtime::Tensor;

// Which Join serves which group object. Global rather than thread-local:
// DDP asks from its gradient hooks, which may run on another thread.
std::mutex registry_mutex;
std::unordered_map<const collectives::ProcessGroup*, const Join*> registry;

// The Join whose loop this thread is in: a model's forward runs on the thread
// that iterates, whichever thread its gradient hooks run on.
thread_local const Join* iterating_here = nullptr;

std::string sample_kind(const Batch& empty) {
  auto one = [](const Tensor& t) {
    runtime::Shape sample(t.shape().begin() + 1, t.shape().end());
    return fmt::format("{} {}", runtime::shape_str(sample), runtime::dtype_name(t.dtype()));
  };
  return fmt::format("x {}, y {}", one(empty.x), one(empty.y));
}

// A 20-bit hash of the sample kind: h and h^2 summed over ranks equal
// world * h and world * h^2 only when every rank's h is the same (zero
// variance), and both sums fit in an int64.
int64_t kind_hash(const std::string& kind) {
  return static_cast<int64_t>(runtime::stable_hash(kind) & ((1u << 20) - 1));
}

}  // namespace

Join::Join(collectives::ProcessGroup& group) : group_(group) {
  const std::lock_guard lock(registry_mutex);
  LOCKSTEP_CHECK(registry.emplace(&group_, this).second,
                 "Join on rank {}: another Join over this process group ('{}') is still alive. "
                 "Use one Join per group at a time: let the first go out of scope before making "
                 "the next, or iterate the same Join again",
                 group_.rank(), group_.name());
}

Join::~Join() {
  const std::lock_guard lock(registry_mutex);
  registry.erase(&group_);
}

const Join* Join::current(const collectives::ProcessGroup& group) {
  const std::lock_guard lock(registry_mutex);
  const auto it = registry.find(&group);
  return it == registry.end() ? nullptr : it->second;
}

const Join* Join::iterating_on_this_thread() { return iterating_here; }

Join::Batches Join::batches(const runtime::DataLoader& loader) & { return Batches(*this, loader); }

// One all-reduce (sum) of [has a batch, h, h^2, which ranks have one], h the
// hash of this rank's sample kind: the first counts the active ranks, the
// next two tell every rank at once when the ranks iterate different kinds of
// data, and the rest are a bit per rank (kRanksPerWord to an int64; each
// rank sets only its own, so the sum is their union).
bool Join::agree(bool has_batch, const std::string& kind) {
  const int64_t h = kind_hash(kind);
  const int64_t world = group_.size();
  const int64_t words = (world + kRanksPerWord - 1) / kRanksPerWord;
  std::vector<int64_t> mine(static_cast<size_t>(3 + words), 0);
  mine[0] = has_batch ? 1 : 0;
  mine[1] = h;
  mine[2] = h * h;
  const int64_t rank = group_.rank();
  if (has_batch)
    mine[static_cast<size_t>(3 + rank / kRanksPerWord)] = int64_t{1} << (rank % kRanksPerWord);
  Tensor votes = Tensor::from_vector<int64_t>(mine, {3 + words});
  group_.allreduce(votes, {.op = collectives::ReduceOp::Sum})->wait();
  const auto sums = votes.to_vector<int64_t>();
  if (sums[1] != world * h || sums[2] != world * h * h) {
    in_iteration_ = false;
    const auto kinds = collectives::allgather_text(kind, group_);
    std::string all;
    for (size_t r = 0; r < kinds.size(); ++r) all += fmt::format("\n  rank {}: {}", r, kinds[r]);
    throw Error(fmt::format(
        "Join on rank {}: the ranks' datasets hold samples of different shapes or dtypes, so "
        "the empty batch of a rank that has run out would not fit the others' model:{}\nEvery "
        "rank must iterate the same kind of dataset",
        group_.rank(), all));
  }
  has_batch_ = has_batch;
  active_ = static_cast<int>(sums[0]);
  in_iteration_ = active_ > 0;
  first_active_ = 0;
  for (int64_t w = 0; w < words; ++w) {
    const auto bits = static_cast<uint64_t>(sums[static_cast<size_t>(3 + w)]);
    if (bits == 0) continue;
    first_active_ = static_cast<int>(w * kRanksPerWord + std::countr_zero(bits));
    break;
  }
  return in_iteration_;
}

Join::Batches::Batches(Join& join, const runtime::DataLoader& loader)
    : join_(&join),
      loader_(&loader),
      empty_(loader.dataset().get_batch({})),
      kind_(sample_kind(empty_)) {}

// A loop left early (break, an exception) ends the iteration for DDP too.
Join::Batches::~Batches() {
  join_->in_iteration_ = false;
  leave_loop();
}

void Join::Batches::leave_loop() {
  if (!in_loop_) return;
  in_loop_ = false;
  iterating_here = outer_;
}

Join::Batches::Iterator Join::Batches::begin() {
  LOCKSTEP_CHECK(!started_,
                 "Join::batches: this range was iterated already; call join.batches(loader) "
                 "again for another pass");
  started_ = true;
  outer_ = std::exchange(iterating_here, join_);
  in_loop_ = true;
  advance();
  return Iterator(this);
}

void Join::Batches::advance() {
  const bool has_batch = next_ < loader_->num_batches();
  if (!join_->agree(has_batch, kind_)) {
    done_ = true;
    current_ = {};
    leave_loop();
    return;
  }
  current_ = has_batch ? loader_->batch(next_++) : empty_;
}

}  // namespace lockstep::nn
