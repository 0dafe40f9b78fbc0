#include "lockstep/collectives/hierarchical_group.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "lockstep/collectives/backend_registry.h"
#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/float_average.h"
#include "lockstep/collectives/reduce_kernels.h"
#include "lockstep/collectives/serial_executor.h"
#include "lockstep/collectives/shm/shm_group.h"
#include "lockstep/distributed/store/prefix_store.h"

namespace lockstep::collectives {
namespace {

using Clock = Work::Clock;
using std::chrono::milliseconds;

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(const std::shared_ptr<distributed::Store>& store, int rank, int size,
                    const std::string& name, milliseconds timeout, const NodeTopology& topology,
                    const std::string& intra_backend);
  ~HierarchicalGroup() override;

  std::string backend() const override { return intra_ + "+gloo"; }

 protected:
  // This node's pool: the reduce within the node reads its tensors in place
  // (the leaders' all-reduce and the broadcast back stage as before). Nodes
  // decide alone; a node of one rank has nothing to share. Joined on the
  // worker, after the collectives issued before it: the node's ranks must add
  // the pool at the same point of the local group's sequence, and the worker
  // issues a collective's local steps when it gets to them, which differs by
  // rank (a rank whose node is done with a broadcast goes on to the next
  // collective while its leader still waits on the other nodes).
  std::shared_ptr<SharedTensorPool> make_shared_pool(size_t bytes) override {
    if (local_->size() == 1) return nullptr;
    std::shared_ptr<SharedTensorPool> pool;
    executor_->run_in_order("adding a shared pool",
                            [&] { pool = local_->reserve_shared_pool(bytes); });
    return pool;
  }

  std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) override;
  std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                   int root) override;
  std::shared_ptr<Work> run_allgather(Call call, Tensor& output,
                                      const Tensor& input) override;
  std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output, const Tensor& input,
                                           ReduceOp op) override;
  std::shared_ptr<Work> run_barrier(Call call) override;
  std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst,
                                 int tag) override;
  std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) override;
  // Every member group is aborted: this node's ranks learn at once through
  // shared memory, the other nodes' leaders when gloo's connections close.
  void abort_peers(const std::string& reason) override;

 private:
  // Issues a collective of a member group with the time left before the
  // deadline and waits for it.
  using Issue = std::function<std::shared_ptr<Work>(milliseconds left)>;

  // Step `step` of 3 of `call` on `member`, checked there as that step of
  // `call` (ProcessGroup::check_next_as).
  void step(const Call& call, uint8_t step, ProcessGroup& member, const std::string& label,
            const Issue& issue);
  void allreduce_steps(const Call& call, Tensor& t, ReduceOp op_kind);
  void broadcast_steps(const Call& call, Tensor& t, int root);
  void reduce_steps(const Call& call, Tensor& t, ReduceOp op_kind, int root);
  void barrier_steps(const Call& call);
  // Steps 1 and 2 of a collective that then runs over `all`: the call
  // checked within the node and among the leaders (see run_allgather).
  void check_steps(const Call& call);
  int local_index_of(int rank) const;  // a rank of this node -> its local rank
  std::shared_ptr<const std::vector<int>> ranks_of(const ProcessGroup& member) const;

  NodeTopology topology_;
  std::string intra_;
  std::shared_ptr<ProcessGroup> local_;    // this node's ranks, over intra_
  std::shared_ptr<ProcessGroup> leaders_;  // one rank per node, over gloo; null off leaders
  std::shared_ptr<ProcessGroup> all_;      // every rank, over gloo
  // This group's rank of each member's ranks, which the members' errors name.
  std::shared_ptr<const std::vector<int>> local_ranks_, leader_ranks_, all_ranks_;
  std::shared_ptr<SerialExecutor> executor_;
  mutable std::mutex step_mutex_;
  std::string current_step_;  // for stall reports; guarded by step_mutex_
};

// The member groups meet under "<name>/hierarchical/<instance>/" in the store:
// <instance> counts this rank's makings of a group of this name (the same on
// every rank), so a group made again under the same name starts afresh. Each
// node's local group has its own prefix, as every node has a local rank 0.
HierarchicalGroup::HierarchicalGroup(const std::shared_ptr<distributed::Store>& store, int rank,
                                     int size, const std::string& name, milliseconds timeout,
                                     const NodeTopology& topology,
                                     const std::string& intra_backend)
    : ProcessGroup(rank, size, name, timeout),
      topology_(topology),
      intra_(intra_backend),
      local_ranks_(std::make_shared<const std::vector<int>>(topology.local_ranks)),
      leader_ranks_(std::make_shared<const std::vector<int>>(topology.leaders)) {
  LOCKSTEP_CHECK(store != nullptr, "group '{}' ({}): a store is needed for the rendezvous", name,
                 backend());
  LOCKSTEP_CHECK(intra_.find('+') == std::string::npos,
                 "group '{}': the intra-node backend must be a single backend such as shm or "
                 "gloo, not '{}'",
                 name, intra_);
  LOCKSTEP_CHECK(is_built_in("gloo"),
                 "group '{}' ({} ranks on {} nodes): the hierarchical backend shm+gloo joins "
                 "the nodes over gloo, which is not built into this lockstep; {}; or choose a "
                 "backend yourself with LOCKSTEP_BACKEND or InitOptions::backend (e.g. mpi)",
                 name, size, topology.nodes, how_to_enable("gloo"));
  LOCKSTEP_CHECK(static_cast<int>(topology.node_of_rank.size()) == size &&
                     topology.local_ranks.size() == static_cast<size_t>(topology.local_size) &&
                     topology.local_rank >= 0 && topology.local_rank < topology.local_size &&
                     topology.local_ranks[static_cast<size_t>(topology.local_rank)] == rank,
                 "group '{}': the node topology given does not describe rank {} of {} ranks",
                 name, rank, size);

  const int64_t instance = store->add(fmt::format("{}/hierarchical/instances/{}", name, rank), 1);
  const std::string base = fmt::format("{}/hierarchical/{}", name, instance);
  const auto prefixed = [&](const std::string& part) {
    return std::make_shared<distributed::PrefixStore>(fmt::format("{}/{}", base, part), store);
  };
  // Made in the same order on every rank (local, leaders, all), so no rank
  // waits in one rendezvous for a peer that waits for it in another. Bare
  // backends: this group is the one wrapped (CUDA staging, desync checks),
  // and its steps reach the members' own call checks directly.
  const auto local_store = prefixed(fmt::format("node{}", topology.node));
  const std::string local_name = fmt::format("{}.node{}", name, topology.node);
  if (intra_ == "shm") {
    // Only reduce, broadcast and barrier run here: shm's own group for send/recv
    // is not needed.
    local_ = make_shm_group(local_store, topology.local_rank, topology.local_size, local_name,
                            timeout, ShmOptions{.p2p = false});
  } else {
    local_ = make_backend_group(intra_, {.store = local_store,
                                         .rank = topology.local_rank,
                                         .size = topology.local_size,
                                         .name = local_name,
                                         .timeout = timeout});
  }
  if (topology.local_rank == 0) {
    leaders_ = make_backend_group("gloo", {.store = prefixed("leaders"),
                                           .rank = topology.node,
                                           .size = topology.nodes,
                                           .name = fmt::format("{}.leaders", name),
                                           .timeout = timeout});
  }
  all_ = make_backend_group("gloo", {.store = prefixed("all"),
                                     .rank = rank,
                                     .size = size,
                                     .name = fmt::format("{}.all", name),
                                     .timeout = timeout});
  // Calls run on the worker alone; a waiting thread reports a stall naming
  // the step (the member groups name the ranks).
  std::vector<int> every_rank(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) every_rank[static_cast<size_t>(r)] = r;
  all_ranks_ = std::make_shared<const std::vector<int>>(std::move(every_rank));
  executor_ = std::make_shared<SerialExecutor>(SerialExecutor::Hooks{
      .where = where(),
      .abort = abort_state(),
      .fail = [this](const std::string& reason) { abort(reason); },
      .waiting_on =
          [this] {
            std::lock_guard lock(step_mutex_);
            return current_step_.empty() ? std::string() : "it is in " + current_step_;
          },
      .run_on_waiter = false,
  });
  executor_->start();
}

HierarchicalGroup::~HierarchicalGroup() {
  executor_->stop();  // a collective already running finishes or reaches its deadline first
}

void HierarchicalGroup::abort_peers(const std::string& reason) {
  for (const auto& member : {local_, leaders_, all_}) {
    if (member != nullptr) member->abort(reason);
  }
}

void HierarchicalGroup::step(const Call& call, uint8_t step, ProcessGroup& member,
                             const std::string& label, const Issue& issue) {
  const auto left = std::chrono::duration_cast<milliseconds>(call.deadline - Clock::now());
  {
    std::lock_guard lock(step_mutex_);
    current_step_ = label;
  }
  try {
    if (left.count() <= 0) {
      throw DeadlineExceeded(fmt::format("its timeout ran out before {} began", label));
    }
    check_next_as(member, call, step, ranks_of(member));
    issue(left)->wait();
  } catch (const CollectiveMismatch&) {
    throw;  // already worded as this group's call
  } catch (const DeadlineExceeded&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(fmt::format("{} failed on {} in {}: {}", call.description(), where(), label,
                                      e.what()));
  }
  std::lock_guard lock(step_mutex_);
  current_step_.clear();
}

// Hierarchical all-reduce. With ranks on N nodes, one leader per node (its
// lowest rank):
//
//   1. reduce     within each node, to the leader       (local group, intra_)
//   2. allreduce  among the N leaders, across nodes      (leaders group, gloo)
//   3. broadcast  within each node, from the leader      (local group, intra_)
//
// Only step 2 crosses the network, with one rank per node taking part, so the
// bytes sent between nodes do not grow with the ranks per node; steps 1 and 3
// run at memory speed. Sum, Min, Max and Product are associative and
// commutative, so reducing in two levels gives what one flat reduction gives
// (bf16 and f16 round at each pairwise step either way; their Avg reduces a
// float copy, float_average.h). Avg must divide by
// the world size, not by a node's size nor by N: steps 1 and 2 reduce with
// Sum and the leader divides once, before step 3, truncating toward zero for
// integers as the other backends do. A step whose group has one rank is
// skipped (a node of one rank; one node).
//
// Each step is checked in its member group as that step of this group's call
// (check_next_as): every rank is checked against its leader within the node,
// and the leaders against each other, so all ranks agree or all fail.
void HierarchicalGroup::allreduce_steps(const Call& call, Tensor& t, ReduceOp op_kind) {
  const ReduceOp combine_op = op_kind == ReduceOp::Avg ? ReduceOp::Sum : op_kind;
  const bool leader = topology_.local_rank == 0;
  if (local_->size() > 1) {
    step(call, 1, *local_, fmt::format("step 1 of 3 (reduce to the node's leader over {})", intra_),
         [&](milliseconds left) {
           return local_->reduce(t, {.op = combine_op, .root = 0, .timeout = left});
         });
  }
  if (leader) {
    if (leaders_->size() > 1) {
      step(call, 2, *leaders_,
           fmt::format("step 2 of 3 (allreduce among the {} node leaders over gloo)",
                       leaders_->size()),
           [&](milliseconds left) {
             return leaders_->allreduce(t, {.op = combine_op, .timeout = left});
           });
    }
    if (op_kind == ReduceOp::Avg) {
      divide_by(t.raw_data(), t.dtype(), static_cast<size_t>(t.numel()), size());
    }
  }
  if (local_->size() > 1) {
    step(call, 3, *local_,
         fmt::format("step 3 of 3 (broadcast from the node's leader over {})", intra_),
         [&](milliseconds left) { return local_->broadcast(t, {.root = 0, .timeout = left}); });
  }
}

/* Hierarchical broadcast from `root`, on node R:
 *
 *   1. broadcast  within node R, from the root           (R's local group)
 *   2. broadcast  among the node leaders, from R's leader (leaders group)
 *   3. broadcast  within every other node, from its leader (local groups)
 *
 * Every byte crosses the network once per node, as in the all-reduce. */
void HierarchicalGroup::broadcast_steps(const Call& call, Tensor& t, int root) {
  const int root_node = topology_.node_of_rank[static_cast<size_t>(root)];
  const bool on_root_node = topology_.node == root_node;
  if (on_root_node && local_->size() > 1) {
    step(call, 1, *local_,
         fmt::format("step 1 of 3 (broadcast within the root's node over {})", intra_),
         [&](milliseconds left) {
           return local_->broadcast(t, {.root = local_index_of(root), .timeout = left});
         });
  }
  if (topology_.local_rank == 0 && leaders_->size() > 1) {
    step(call, 2, *leaders_,
         fmt::format("step 2 of 3 (broadcast among the {} node leaders over gloo)",
                     leaders_->size()),
         [&](milliseconds left) {
           return leaders_->broadcast(t, {.root = root_node, .timeout = left});
         });
  }
  if (!on_root_node && local_->size() > 1) {
    step(call, 3, *local_,
         fmt::format("step 3 of 3 (broadcast from the node's leader over {})", intra_),
         [&](milliseconds left) { return local_->broadcast(t, {.root = 0, .timeout = left}); });
  }
}

/* Hierarchical reduce to `root`, on node R:
 *
 *   1. reduce     within every node, to its leader        (local groups)
 *   2. reduce     among the node leaders, to R's leader   (leaders group)
 *   3. broadcast  within node R from its leader, when the root is another
 *                 rank of R (a reduce leaves the other ranks' tensors
 *                 unspecified, so this may overwrite them)
 *
 * Avg sums and divides once on R's leader, as allreduce_steps explains. */
void HierarchicalGroup::reduce_steps(const Call& call, Tensor& t, ReduceOp op_kind, int root) {
  const ReduceOp combine_op = op_kind == ReduceOp::Avg ? ReduceOp::Sum : op_kind;
  const int root_node = topology_.node_of_rank[static_cast<size_t>(root)];
  const bool on_root_node = topology_.node == root_node;
  if (local_->size() > 1) {
    step(call, 1, *local_, fmt::format("step 1 of 3 (reduce to the node's leader over {})", intra_),
         [&](milliseconds left) {
           return local_->reduce(t, {.op = combine_op, .root = 0, .timeout = left});
         });
  }
  if (topology_.local_rank == 0) {
    if (leaders_->size() > 1) {
      step(call, 2, *leaders_,
           fmt::format("step 2 of 3 (reduce among the {} node leaders over gloo)",
                       leaders_->size()),
           [&](milliseconds left) {
             return leaders_->reduce(t, {.op = combine_op, .root = root_node, .timeout = left});
           });
    }
    if (on_root_node && op_kind == ReduceOp::Avg) {
      divide_by(t.raw_data(), t.dtype(), static_cast<size_t>(t.numel()), size());
    }
  }
  if (on_root_node && root != topology_.leaders[static_cast<size_t>(root_node)] &&
      local_->size() > 1) {
    step(call, 3, *local_,
         fmt::format("step 3 of 3 (broadcast from the node's leader to the root over {})",
                     intra_),
         [&](milliseconds left) { return local_->broadcast(t, {.root = 0, .timeout = left}); });
  }
}

// A barrier within every node, among the leaders, then within every node
// again: no rank leaves before every rank of every node has arrived.
void HierarchicalGroup::barrier_steps(const Call& call) {
  check_steps(call);
  if (local_->size() > 1) {
    step(call, 3, *local_, fmt::format("step 3 of 3 (barrier within the node over {})", intra_),
         [&](milliseconds left) { return local_->barrier({.timeout = left}); });
  }
}

// Steps 1 and 2 of 3: a barrier within the node, then among the leaders,
// each checked as `call` (a barrier's first two steps; before an allgather's
// or reduce_scatter's data moves, the check that every rank is in it).
void HierarchicalGroup::check_steps(const Call& call) {
  if (local_->size() > 1) {
    step(call, 1, *local_, fmt::format("step 1 of 3 (barrier within the node over {})", intra_),
         [&](milliseconds left) { return local_->barrier({.timeout = left}); });
  }
  if (topology_.local_rank == 0 && leaders_->size() > 1) {
    step(call, 2, *leaders_,
         fmt::format("step 2 of 3 (barrier among the {} node leaders over gloo)",
                     leaders_->size()),
         [&](milliseconds left) { return leaders_->barrier({.timeout = left}); });
  }
}

std::shared_ptr<const std::vector<int>> HierarchicalGroup::ranks_of(
    const ProcessGroup& member) const {
  if (&member == local_.get()) return local_ranks_;
  return &member == leaders_.get() ? leader_ranks_ : all_ranks_;
}

int HierarchicalGroup::local_index_of(int r) const {
  const auto& ranks = topology_.local_ranks;
  const auto it = std::find(ranks.begin(), ranks.end(), r);
  LOCKSTEP_ASSERT(it != ranks.end());
  return static_cast<int>(it - ranks.begin());
}

// A collective that moves nothing still runs its steps, so that every rank's
// call is checked.
std::shared_ptr<Work> HierarchicalGroup::run_allreduce(Call call, Tensor& tensor,
                                                       ReduceOp op) {
  return executor_->submit(std::move(call), [this, t = tensor, op](const Call& c) {
    Tensor x = in_reduction_dtype(t, op);
    allreduce_steps(c, x, op);
    write_back(t, x);
  });
}

std::shared_ptr<Work> HierarchicalGroup::run_broadcast(Call call, Tensor& tensor,
                                                       int root) {
  return executor_->submit(std::move(call), [this, t = tensor, root](const Call& c) mutable {
    broadcast_steps(c, t, root);
  });
}

std::shared_ptr<Work> HierarchicalGroup::run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                                    int root) {
  return executor_->submit(std::move(call), [this, t = tensor, op, root](const Call& c) {
    Tensor x = in_reduction_dtype(t, op);
    reduce_steps(c, x, op, root);
    write_back(t, x);
  });
}

// allgather and reduce_scatter move their data over the flat gloo group
// (their chunks follow rank order, which need not follow the nodes), still in
// issue order on the worker. The call is checked first where the other
// collectives are (check_steps): a rank in an allgather while another is in
// an all-reduce would otherwise wait in `all` for a peer that waits for it
// in its node's group, both until the timeout, instead of failing at once.
std::shared_ptr<Work> HierarchicalGroup::run_allgather(Call call, Tensor& output,
                                                       const Tensor& input) {
  return executor_->submit(std::move(call), [this, out = output, in = input](const Call& c) mutable {
    check_steps(c);
    step(c, 3, *all_, "step 3 of 3 (the allgather over gloo among all ranks)",
         [&](milliseconds left) { return all_->allgather(out, in, {.timeout = left}); });
  });
}

std::shared_ptr<Work> HierarchicalGroup::run_reduce_scatter(Call call, Tensor& output,
                                                            const Tensor& input, ReduceOp op) {
  return executor_->submit(std::move(call), [this, out = output, in = input, op](const Call& c) mutable {
    check_steps(c);
    step(c, 3, *all_, "step 3 of 3 (the reduce_scatter over gloo among all ranks)",
         [&](milliseconds left) {
           return all_->reduce_scatter(out, in, {.op = op, .timeout = left});
         });
  });
}

std::shared_ptr<Work> HierarchicalGroup::run_barrier(Call call) {
  return executor_->submit(std::move(call), [this](const Call& c) { barrier_steps(c); });
}

// Posted at once rather than queued: gloo matches sends and recvs by issue
// order, and a recv waited for on the worker would block a later send.
std::shared_ptr<Work> HierarchicalGroup::run_send(Call call, const Tensor& tensor, int dst,
                                                  int tag) {
  return all_->send(tensor, dst, {.tag = tag, .timeout = call.timeout});
}

std::shared_ptr<Work> HierarchicalGroup::run_recv(Call call, Tensor& tensor, int src,
                                                  int tag) {
  return all_->recv(tensor, src, {.tag = tag, .timeout = call.timeout});
}

}  // namespace

std::shared_ptr<ProcessGroup> make_hierarchical_group(std::shared_ptr<distributed::Store> store,
                                                      int rank, int size,
                                                      const std::string& name,
                                                      std::chrono::milliseconds timeout,
                                                      const NodeTopology& topology,
                                                      const std::string& intra_backend) {
  return std::make_shared<HierarchicalGroup>(store, rank, size, name, timeout, topology,
                                             intra_backend);
}

}  // namespace lockstep::collectives
