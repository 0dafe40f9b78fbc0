#include "lockstep/collectives/hierarchical_group.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/init.h"
#include "lockstep/collectives/reduce_kernels.h"
#include "lockstep/collectives/shm/shm_group.h"
#include "lockstep/runtime/store/prefix_store.h"

namespace lockstep::collectives {
namespace {

using Clock = Work::Clock;
using std::chrono::milliseconds;

// How long after a collective's deadline its Work gives up by itself. Each
// step waits at most until the deadline, so the worker's error, which names
// the step, normally arrives first; this only guards against a stuck worker.
constexpr milliseconds kWorkerGrace{2000};

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(const std::shared_ptr<runtime::Store>& store, int rank, int size,
                    const std::string& name, milliseconds timeout, const NodeTopology& topology,
                    const std::string& intra_backend);
  ~HierarchicalGroup() override;

  std::string backend() const override { return intra_ + "+gloo"; }

  // This node's pool: the reduce within the node reads its tensors in place
  // (the leaders' all-reduce and the broadcast back stage as before). Nodes
  // decide alone; a node of one rank has nothing to share.
  std::shared_ptr<SharedTensorPool> reserve_shared_pool(size_t bytes) override {
    return local_->size() > 1 ? local_->reserve_shared_pool(bytes) : nullptr;
  }

  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts) override;
  std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& opts) override;
  std::shared_ptr<Work> allgather(Tensor& output, const Tensor& input,
                                  const AllgatherOptions& opts) override;
  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                       const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& opts) override;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, const SendRecvOptions& opts) override;
  std::shared_ptr<Work> recv(Tensor& tensor, int src, const SendRecvOptions& opts) override;

 private:
  // A collective on the worker: its description and deadline, and a body that
  // runs its steps.
  struct Running {
    std::string description;
    Clock::time_point deadline;
    milliseconds timeout;
  };
  using Body = std::function<void(const Running&)>;
  struct Queued {
    std::shared_ptr<Work> work;
    Running op;
    Body body;
  };
  // Issues a collective of a member group with the time left before the
  // deadline and waits for it.
  using Issue = std::function<std::shared_ptr<Work>(milliseconds left)>;

  void throw_if_aborted(std::string_view op);
  std::shared_ptr<Work> enqueue(std::string description, milliseconds timeout, Body body);
  void run_collectives();
  void step(const Running& op, const std::string& label, const Issue& issue);
  void run_allreduce(const Running& op, Tensor& t, ReduceOp op_kind);
  void run_broadcast(const Running& op, Tensor& t, int root);
  void run_reduce(const Running& op, Tensor& t, ReduceOp op_kind, int root);
  void run_barrier(const Running& op);
  int local_index_of(int rank) const;  // a rank of this node -> its local rank
  void check_sizes(std::string_view op, const Tensor& big, const Tensor& small) const;

  NodeTopology topology_;
  std::string intra_;
  std::shared_ptr<ProcessGroup> local_;    // this node's ranks, over intra_
  std::shared_ptr<ProcessGroup> leaders_;  // one rank per node, over gloo; null off leaders
  std::shared_ptr<ProcessGroup> all_;      // every rank, over gloo
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Queued> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

// The member groups meet under "<name>/hierarchical/<instance>/" in the store:
// <instance> counts this rank's makings of a group of this name (the same on
// every rank), so a group made again under the same name starts afresh. Each
// node's local group has its own prefix, as every node has a local rank 0.
HierarchicalGroup::HierarchicalGroup(const std::shared_ptr<runtime::Store>& store, int rank,
                                     int size, const std::string& name, milliseconds timeout,
                                     const NodeTopology& topology,
                                     const std::string& intra_backend)
    : ProcessGroup(rank, size, name, timeout), topology_(topology), intra_(intra_backend) {
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
    return std::make_shared<runtime::PrefixStore>(fmt::format("{}/{}", base, part), store);
  };
  // Made in the same order on every rank (local, leaders, all), so no rank
  // waits in one rendezvous for a peer that waits for it in another.
  const auto local_store = prefixed(fmt::format("node{}", topology.node));
  const std::string local_name = fmt::format("{}.node{}", name, topology.node);
  if (intra_ == "shm") {
    // Only reduce, broadcast and barrier run here: shm's own group for send/recv
    // is not needed.
    local_ = make_shm_group(local_store, topology.local_rank, topology.local_size, local_name,
                            timeout, ShmOptions{.p2p = false});
  } else {
    local_ = make_process_group(intra_, local_store, topology.local_rank, topology.local_size,
                                local_name, timeout);
  }
  if (topology.local_rank == 0) {
    leaders_ = make_process_group("gloo", prefixed("leaders"), topology.node, topology.nodes,
                                  fmt::format("{}.leaders", name), timeout);
  }
  all_ = make_process_group("gloo", prefixed("all"), rank, size, fmt::format("{}.all", name),
                            timeout);
  worker_ = std::thread([this] { run_collectives(); });
}

HierarchicalGroup::~HierarchicalGroup() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  // A collective already running finishes or reaches its deadline first.
  worker_.join();
}

void HierarchicalGroup::throw_if_aborted(std::string_view op) {
  const std::string reason = abort_->reason();
  if (reason.empty()) return;
  throw CollectiveError(fmt::format(
      "{} on rank {} of group '{}' ({}): the group is unusable because {}; the ranks may now "
      "disagree on which collectives ran, so create a new process group on every rank (or "
      "restart the job)",
      op, rank(), name(), backend(), reason));
}

std::shared_ptr<Work> HierarchicalGroup::enqueue(std::string description, milliseconds timeout,
                                                 Body body) {
  std::weak_ptr<AbortState> abort = abort_;
  auto work = std::make_shared<Work>(description, Clock::now() + timeout + kWorkerGrace,
                                     timeout_message(description, timeout), [abort, description] {
                                       if (auto state = abort.lock()) {
                                         state->set(fmt::format("{} timed out", description));
                                       }
                                     });
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({work, {std::move(description), Clock::now() + timeout, timeout},
                      std::move(body)});
  }
  queue_cv_.notify_one();
  return work;
}

// The worker: one collective at a time, in issue order (the same on every
// rank, so the member groups see their collectives in the same order too).
// After a failure the group is aborted and what is still queued fails at once.
void HierarchicalGroup::run_collectives() {
  for (;;) {
    Queued q;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      q = std::move(queue_.front());
      queue_.pop_front();
      stopping = stopping_;
    }
    std::string refusal;
    if (stopping) {
      refusal = "the group was destroyed first";
    } else if (const std::string reason = abort_->reason(); !reason.empty()) {
      refusal = fmt::format("the group is unusable because {}", reason);
    }
    if (!refusal.empty()) {
      q.work->finish(std::make_exception_ptr(
          CollectiveError(fmt::format("{} on rank {} of group '{}' ({}) did not run: {}",
                                      q.op.description, rank(), name(), backend(), refusal))));
      continue;
    }
    try {
      q.body(q.op);
      q.work->finish();
    } catch (const std::exception& e) {
      abort_->set(fmt::format("{} failed", q.op.description));
      q.work->finish(std::make_exception_ptr(CollectiveError(e.what())));
    }
  }
}

void HierarchicalGroup::step(const Running& op, const std::string& label, const Issue& issue) {
  const auto left = std::chrono::duration_cast<milliseconds>(op.deadline - Clock::now());
  try {
    LOCKSTEP_CHECK(left.count() > 0, "its timeout of {:.3g} s ran out before this step began",
                   static_cast<double>(op.timeout.count()) / 1000.0);
    issue(left)->wait();
  } catch (const std::exception& e) {
    throw CollectiveError(fmt::format("{} failed on rank {} of group '{}' ({}, {} ranks) in {}: {}",
                                      op.description, rank(), name(), backend(), size(), label,
                                      e.what()));
  }
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
// (bf16 and f16 round at each pairwise step either way). Avg must divide by
// the world size, not by a node's size nor by N: steps 1 and 2 reduce with
// Sum and the leader divides once, before step 3, truncating toward zero for
// integers as the other backends do. A step whose group has one rank is
// skipped (a node of one rank; one node).
void HierarchicalGroup::run_allreduce(const Running& op, Tensor& t, ReduceOp op_kind) {
  if (t.numel() == 0) return;
  const ReduceOp combine_op = op_kind == ReduceOp::Avg ? ReduceOp::Sum : op_kind;
  const bool leader = topology_.local_rank == 0;
  if (local_->size() > 1) {
    step(op, fmt::format("step 1 of 3 (reduce to the node's leader over {})", intra_),
         [&](milliseconds left) {
           return local_->reduce(t, {.op = combine_op, .root = 0, .timeout = left});
         });
  }
  if (leader) {
    if (leaders_->size() > 1) {
      step(op, fmt::format("step 2 of 3 (allreduce among the {} node leaders over gloo)",
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
    step(op, fmt::format("step 3 of 3 (broadcast from the node's leader over {})", intra_),
         [&](milliseconds left) { return local_->broadcast(t, {.root = 0, .timeout = left}); });
  }
}

std::shared_ptr<Work> HierarchicalGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  check_tensor("allreduce", tensor);
  throw_if_aborted("allreduce");
  next_seq();
  return enqueue(describe("allreduce", &tensor, to_string(opts.op)), timeout_of(opts.timeout),
                 [this, t = tensor, op_kind = opts.op](const Running& op) mutable {
                   run_allreduce(op, t, op_kind);
                 });
}

/* Hierarchical broadcast from `root`, on node R:
 *
 *   1. broadcast  within node R, from the root           (R's local group)
 *   2. broadcast  among the node leaders, from R's leader (leaders group)
 *   3. broadcast  within every other node, from its leader (local groups)
 *
 * Every byte crosses the network once per node, as in the all-reduce. */
void HierarchicalGroup::run_broadcast(const Running& op, Tensor& t, int root) {
  if (t.numel() == 0) return;
  const int root_node = topology_.node_of_rank[static_cast<size_t>(root)];
  const bool on_root_node = topology_.node == root_node;
  if (on_root_node && local_->size() > 1) {
    step(op, fmt::format("step 1 of 3 (broadcast within the root's node over {})", intra_),
         [&](milliseconds left) {
           return local_->broadcast(t, {.root = local_index_of(root), .timeout = left});
         });
  }
  if (topology_.local_rank == 0 && leaders_->size() > 1) {
    step(op, fmt::format("step 2 of 3 (broadcast among the {} node leaders over gloo)",
                         leaders_->size()),
         [&](milliseconds left) {
           return leaders_->broadcast(t, {.root = root_node, .timeout = left});
         });
  }
  if (!on_root_node && local_->size() > 1) {
    step(op, fmt::format("step 3 of 3 (broadcast from the node's leader over {})", intra_),
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
 * Avg sums and divides once on R's leader, as run_allreduce explains. */
void HierarchicalGroup::run_reduce(const Running& op, Tensor& t, ReduceOp op_kind, int root) {
  if (t.numel() == 0) return;
  const ReduceOp combine_op = op_kind == ReduceOp::Avg ? ReduceOp::Sum : op_kind;
  const int root_node = topology_.node_of_rank[static_cast<size_t>(root)];
  const bool on_root_node = topology_.node == root_node;
  if (local_->size() > 1) {
    step(op, fmt::format("step 1 of 3 (reduce to the node's leader over {})", intra_),
         [&](milliseconds left) {
           return local_->reduce(t, {.op = combine_op, .root = 0, .timeout = left});
         });
  }
  if (topology_.local_rank == 0) {
    if (leaders_->size() > 1) {
      step(op, fmt::format("step 2 of 3 (reduce among the {} node leaders over gloo)",
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
    step(op, fmt::format("step 3 of 3 (broadcast from the node's leader to the root over {})",
                         intra_),
         [&](milliseconds left) { return local_->broadcast(t, {.root = 0, .timeout = left}); });
  }
}

// A barrier within every node, among the leaders, then within every node
// again: no rank leaves before every rank of every node has arrived.
void HierarchicalGroup::run_barrier(const Running& op) {
  const auto local_barrier = [&](const char* label) {
    if (local_->size() > 1) {
      step(op, fmt::format("{} (barrier within the node over {})", label, intra_),
           [&](milliseconds left) { return local_->barrier({.timeout = left}); });
    }
  };
  local_barrier("step 1 of 3");
  if (topology_.local_rank == 0 && leaders_->size() > 1) {
    step(op, fmt::format("step 2 of 3 (barrier among the {} node leaders over gloo)",
                         leaders_->size()),
         [&](milliseconds left) { return leaders_->barrier({.timeout = left}); });
  }
  local_barrier("step 3 of 3");
}

int HierarchicalGroup::local_index_of(int r) const {
  const auto& ranks = topology_.local_ranks;
  const auto it = std::find(ranks.begin(), ranks.end(), r);
  LOCKSTEP_ASSERT(it != ranks.end());
  return static_cast<int>(it - ranks.begin());
}

std::shared_ptr<Work> HierarchicalGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  check_tensor("broadcast", tensor);
  check_root("broadcast", opts.root);
  throw_if_aborted("broadcast");
  next_seq();
  return enqueue(describe("broadcast", &tensor, fmt::format("root {}", opts.root)),
                 timeout_of(opts.timeout),
                 [this, t = tensor, root = opts.root](const Running& op) mutable {
                   run_broadcast(op, t, root);
                 });
}

std::shared_ptr<Work> HierarchicalGroup::reduce(Tensor& tensor, const ReduceOptions& opts) {
  check_tensor("reduce", tensor);
  check_root("reduce", opts.root);
  throw_if_aborted("reduce");
  next_seq();
  return enqueue(
      describe("reduce", &tensor, fmt::format("{}, root {}", to_string(opts.op), opts.root)),
      timeout_of(opts.timeout),
      [this, t = tensor, op_kind = opts.op, root = opts.root](const Running& op) mutable {
        run_reduce(op, t, op_kind, root);
      });
}

// `big` must hold size() * small.numel() elements of small's dtype.
void HierarchicalGroup::check_sizes(std::string_view op, const Tensor& big,
                                    const Tensor& small) const {
  LOCKSTEP_CHECK(big.dtype() == small.dtype(),
                 "{} on group '{}': the tensors have dtypes {} and {}; they must match", op,
                 name(), runtime::dtype_name(big.dtype()), runtime::dtype_name(small.dtype()));
  LOCKSTEP_CHECK(big.numel() == small.numel() * size(),
                 "{} on group '{}': the larger tensor has {} elements but needs size() * {} = "
                 "{} * {} = {}",
                 op, name(), big.numel(), small.numel(), size(), small.numel(),
                 small.numel() * size());
}

// allgather and reduce_scatter run over the flat gloo group (their chunks
// follow rank order, which need not follow the nodes), still in issue order
// on the worker.
std::shared_ptr<Work> HierarchicalGroup::allgather(Tensor& output, const Tensor& input,
                                                   const AllgatherOptions& opts) {
  check_tensor("allgather", input);
  check_tensor("allgather", output);
  check_sizes("allgather", output, input);
  throw_if_aborted("allgather");
  next_seq();
  return enqueue(describe("allgather", &input, ""), timeout_of(opts.timeout),
                 [this, out = output, in = input](const Running& op) mutable {
                   step(op, "the allgather over gloo among all ranks", [&](milliseconds left) {
                     return all_->allgather(out, in, {.timeout = left});
                   });
                 });
}

std::shared_ptr<Work> HierarchicalGroup::reduce_scatter(Tensor& output, const Tensor& input,
                                                        const ReduceScatterOptions& opts) {
  check_tensor("reduce_scatter", input);
  check_tensor("reduce_scatter", output);
  check_sizes("reduce_scatter", input, output);
  throw_if_aborted("reduce_scatter");
  next_seq();
  return enqueue(describe("reduce_scatter", &output, to_string(opts.op)),
                 timeout_of(opts.timeout),
                 [this, out = output, in = input, op_kind = opts.op](const Running& op) mutable {
                   step(op, "the reduce_scatter over gloo among all ranks",
                        [&](milliseconds left) {
                          return all_->reduce_scatter(out, in, {.op = op_kind, .timeout = left});
                        });
                 });
}

std::shared_ptr<Work> HierarchicalGroup::barrier(const BarrierOptions& opts) {
  throw_if_aborted("barrier");
  next_seq();
  return enqueue(describe("barrier", nullptr, ""), timeout_of(opts.timeout),
                 [this](const Running& op) { run_barrier(op); });
}

// Posted at once rather than queued: gloo matches sends and recvs by issue
// order, and a recv waited for on the worker would block a later send.
std::shared_ptr<Work> HierarchicalGroup::send(const Tensor& tensor, int dst,
                                              const SendRecvOptions& opts) {
  throw_if_aborted("send");
  return all_->send(tensor, dst, opts);
}

std::shared_ptr<Work> HierarchicalGroup::recv(Tensor& tensor, int src,
                                              const SendRecvOptions& opts) {
  throw_if_aborted("recv");
  return all_->recv(tensor, src, opts);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_hierarchical_group(std::shared_ptr<runtime::Store> store,
                                                      int rank, int size,
                                                      const std::string& name,
                                                      std::chrono::milliseconds timeout,
                                                      const NodeTopology& topology,
                                                      const std::string& intra_backend) {
  return std::make_shared<HierarchicalGroup>(store, rank, size, name, timeout, topology,
                                             intra_backend);
}

}  // namespace lockstep::collectives
