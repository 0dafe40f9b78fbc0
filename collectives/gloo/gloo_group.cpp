#include "lockstep/collectives/gloo/gloo_group.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/gloo/gloo_store_adapter.h"
#include "lockstep/collectives/reduce_kernels.h"

namespace lockstep::collectives {
namespace {

using Clock = Work::Clock;
using std::chrono::milliseconds;
using ::gloo::transport::UnboundBuffer;

// Slots of send/recv: gloo's collectives use slot prefixes 0x01..0x08 in the
// top byte (gloo/types.h), so point-to-point traffic gets its own prefix.
constexpr uint64_t kP2pSlotPrefix = uint64_t{0x40} << 56;

uint64_t p2p_slot(int tag) { return kP2pSlotPrefix | static_cast<uint32_t>(tag); }

// gloo calls this to combine two chunks; the arithmetic is reduce_kernels.h's.
std::function<void(void*, const void*, const void*, size_t)> reduce_function(runtime::DType dtype,
                                                                              ReduceOp op) {
  return [dtype, op](void* out, const void* a, const void* b, size_t n) {
    combine(dtype, op, out, a, b, n);
  };
}

// gloo sizes its chunks in elements of sizeof(T); the reduction itself is ours
// (reduce_kernels.h), so any T of the right size does.
template <class Fn>
void with_element_type(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 2: fn(uint16_t{}); return;
    case 4: fn(uint32_t{}); return;
    case 8: fn(uint64_t{}); return;
    default: LOCKSTEP_ASSERT(element_size == 2 || element_size == 4 || element_size == 8);
  }
}

size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

class GlooGroup final : public ProcessGroup {
 public:
  GlooGroup(std::shared_ptr<runtime::Store> store, int rank, int size, const std::string& name,
            milliseconds timeout, const std::string& bind_address);
  ~GlooGroup() override;

  std::string backend() const override { return "gloo"; }

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
  // A collective's body runs on the worker thread with the time left before
  // its deadline (gloo's own timeout for the op) and its gloo tag.
  using Body = std::function<void(milliseconds timeout, uint32_t tag)>;
  struct Queued {
    std::shared_ptr<Work> work;
    std::string description;
    Clock::time_point deadline;
    uint32_t tag;
    Body body;
  };
  // A posted send or recv and the thread that waits for it. Each has its own
  // thread: waiting in issue order on one thread would deadlock a rank that
  // posts recv(tag 2), recv(tag 1) and then waits for send(tag 1).
  struct PendingP2p {
    std::shared_ptr<Work> work;
    std::string description;
    Clock::time_point deadline;
    std::unique_ptr<UnboundBuffer> buffer;  // guarded by mutex_ once posted
    Tensor tensor;  // keeps the memory alive while gloo may touch it
    bool is_send;
    bool done = false;  // guarded by mutex_
    std::thread waiter;
  };

  void connect(const std::shared_ptr<runtime::Store>& store, const std::string& bind_address);
  void learn_peer_addresses(::gloo::rendezvous::Store& store);
  std::shared_ptr<Work> make_work(const std::string& description, milliseconds timeout);
  void throw_if_aborted(std::string_view op);
  std::shared_ptr<Work> enqueue(const std::string& description, milliseconds timeout, Body body);
  std::shared_ptr<Work> post_p2p(std::string_view op, const Tensor& tensor, int peer,
                                 const SendRecvOptions& opts, bool is_send);
  void run_collectives();
  void wait_p2p(PendingP2p& p);
  void reap_p2p_locked();
  std::exception_ptr failure(const std::string& description, const std::exception& cause,
                             milliseconds timeout);
  std::string name_broken_peers(const std::string& cause) const;

  template <class Options>
  void set_output(Options& o, const Tensor& t) {
    auto buffer = context_->createUnboundBuffer(t.raw_data(), nbytes(t));
    with_element_type(t.element_size(), [&](auto e) {
      o.template setOutput<decltype(e)>(std::move(buffer));
    });
  }
  void run_allreduce(const Tensor& t, ReduceOp op, milliseconds timeout, uint32_t tag);

  // Declared first so that it is destroyed last: buffers of failed sends and
  // recvs (with their tensors' memory), which gloo may still reference until
  // the context is gone.
  std::vector<std::pair<std::unique_ptr<UnboundBuffer>, Tensor>> graveyard_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  std::vector<std::string> peer_addresses_;  // gloo's address string of each peer's pair
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
  uint32_t next_tag_ = 0;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Queued> queue_;
  std::list<PendingP2p> p2p_;
  bool stopping_ = false;
  std::thread worker_;
};

GlooGroup::GlooGroup(std::shared_ptr<runtime::Store> store, int rank, int size,
                     const std::string& name, milliseconds timeout,
                     const std::string& bind_address)
    : ProcessGroup(rank, size, name, timeout) {
  LOCKSTEP_CHECK(store != nullptr, "gloo group '{}': a store is needed for the rendezvous", name);
  connect(store, bind_address);
  worker_ = std::thread([this] { run_collectives(); });
}

GlooGroup::~GlooGroup() {
  std::list<PendingP2p> p2p;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    // Sends and recvs still waited for are cancelled (their Work fails).
    for (auto& p : p2p_) {
      if (p.done || !p.buffer) continue;
      if (p.is_send) p.buffer->abortWaitSend(); else p.buffer->abortWaitRecv();
    }
    p2p.splice(p2p.end(), p2p_);
  }
  queue_cv_.notify_all();
  for (auto& p : p2p) p.waiter.join();
  // A collective already inside gloo finishes or times out (its own timeout)
  // before the worker sees the stop.
  worker_.join();
}

// Rendezvous: every rank publishes its gloo addresses under a per-group
// prefix of the store and connects to every other rank (a full mesh). The
// prefix carries a count of this rank's groups of the same name, so a group
// made again under an old name does not read the previous one's addresses.
void GlooGroup::connect(const std::shared_ptr<runtime::Store>& store,
                        const std::string& bind_address) {
  try {
    const int64_t instance = store->add(fmt::format("{}/gloo/instances/{}", name(), rank()), 1);
    gloo_backend::GlooStoreAdapter adapter(store, fmt::format("{}/gloo/{}/", name(), instance),
                                           timeout());
    ::gloo::transport::tcp::attr attr;
    attr.hostname = bind_address;
    device_ = ::gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<::gloo::rendezvous::Context>(rank(), size());
    context_->setTimeout(timeout());
    context_->connectFullMesh(adapter, device_);
    learn_peer_addresses(adapter);
  } catch (const std::exception& e) {
    throw Error(fmt::format(
        "gloo: rank {} of group '{}' ({} ranks) could not connect to its peers (listening on "
        "{}): {}. Check that every rank started, all use the same store, and that {} is "
        "reachable from the other ranks' hosts",
        rank(), name(), size(), bind_address, e.what(), bind_address));
  }
}

// gloo's connection errors name the peer's pair address ("Connection closed
// by peer [10.0.0.2]:41234"); each rank publishes its pair addresses so that
// such errors can be turned into rank numbers.
void GlooGroup::learn_peer_addresses(::gloo::rendezvous::Store& store) {
  std::string mine;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank()) mine += fmt::format("{} {}\n", peer, context_->getPair(peer)->address().str());
  }
  store.set(fmt::format("pair_addresses/{}", rank()), std::vector<char>(mine.begin(), mine.end()));
  peer_addresses_.assign(static_cast<size_t>(size()), "");
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    const auto bytes = store.get(fmt::format("pair_addresses/{}", peer));
    std::istringstream lines(std::string(bytes.begin(), bytes.end()));
    int other = -1;
    std::string address;
    while (lines >> other >> address) {
      if (other == rank()) peer_addresses_[static_cast<size_t>(peer)] = address;
    }
  }
}

std::shared_ptr<Work> GlooGroup::make_work(const std::string& description, milliseconds timeout) {
  std::weak_ptr<AbortState> abort = abort_;
  return std::make_shared<Work>(description, Clock::now() + timeout,
                                timeout_message(description, timeout), [abort, description] {
                                  if (auto state = abort.lock()) {
                                    state->set(fmt::format("{} timed out", description));
                                  }
                                });
}

void GlooGroup::throw_if_aborted(std::string_view op) {
  const std::string reason = abort_->reason();
  if (reason.empty()) return;
  throw CollectiveError(fmt::format(
      "{} on rank {} of group '{}' (gloo): the group is unusable because {}; the ranks may "
      "now disagree on which collectives ran, so create a new process group on every rank "
      "(or restart the job)",
      op, rank(), name(), reason));
}

std::shared_ptr<Work> GlooGroup::enqueue(const std::string& description, milliseconds timeout,
                                         Body body) {
  auto work = make_work(description, timeout);
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({work, description, Clock::now() + timeout, next_tag_++, std::move(body)});
  }
  queue_cv_.notify_one();
  return work;
}

// The worker: runs queued collectives one at a time, in issue order (which is
// the same on every rank, so gloo's tags match). After a failure the group is
// aborted and what is still queued fails at once.
void GlooGroup::run_collectives() {
  for (;;) {
    Queued op;
    {
      std::unique_lock lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        op.work->finish(std::make_exception_ptr(CollectiveError(fmt::format(
            "{} on rank {} of group '{}' (gloo) did not run: the group was destroyed first",
            op.description, rank(), name()))));
        continue;
      }
    }
    if (const std::string reason = abort_->reason(); !reason.empty()) {
      op.work->finish(std::make_exception_ptr(CollectiveError(
          fmt::format("{} on rank {} of group '{}' (gloo) did not run: the group is unusable "
                      "because {}",
                      op.description, rank(), name(), reason))));
      continue;
    }
    const auto left = std::chrono::duration_cast<milliseconds>(op.deadline - Clock::now());
    const milliseconds timeout = left.count() > 0 ? left : milliseconds(1);
    try {
      op.body(timeout, op.tag);
      op.work->finish();
    } catch (const std::exception& e) {
      op.work->finish(failure(op.description, e, timeout));
    }
  }
}

void GlooGroup::wait_p2p(PendingP2p& p) {
  std::exception_ptr error;
  const auto left = std::chrono::duration_cast<milliseconds>(p.deadline - Clock::now());
  const milliseconds timeout = left.count() > 0 ? left : milliseconds(1);
  try {
    const bool done = p.is_send ? p.buffer->waitSend(timeout) : p.buffer->waitRecv(timeout);
    if (!done) {
      error = std::make_exception_ptr(CollectiveError(fmt::format(
          "{} on rank {} of group '{}' (gloo) was cancelled: the group was destroyed first",
          p.description, rank(), name())));
    }
  } catch (const std::exception& e) {
    error = failure(p.description, e, timeout);
  }
  std::shared_ptr<Work> work = p.work;
  {
    std::lock_guard lock(mutex_);
    if (error) graveyard_.emplace_back(std::move(p.buffer), p.tensor);
    p.done = true;
  }
  work->finish(error);
}

// Joins the waiters that are done, so that the list stays short.
void GlooGroup::reap_p2p_locked() {
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    if (it->done) {
      it->waiter.join();
      it = p2p_.erase(it);
    } else {
      ++it;
    }
  }
}

// Turns what gloo threw into a CollectiveError naming the op, this rank, the
// group and the cause, and aborts the group: gloo's pairs are unusable after
// an I/O error, and after a timeout the ranks no longer agree on what ran.
std::exception_ptr GlooGroup::failure(const std::string& description,
                                      const std::exception& cause, milliseconds timeout) {
  const std::string what = cause.what();
  std::string message;
  if (what.find("Timed out") != std::string::npos) {
    message = fmt::format("{} (gloo: {})", timeout_message(description, timeout), what);
  } else {
    message = fmt::format("{} failed on rank {} of group '{}' (gloo, {} ranks): {}{}",
                          description, rank(), name(), size(), what, name_broken_peers(what));
  }
  abort_->set(fmt::format("{} failed", description));
  return std::make_exception_ptr(CollectiveError(message));
}

std::string GlooGroup::name_broken_peers(const std::string& cause) const {
  std::vector<int> peers;
  for (int peer = 0; peer < size(); ++peer) {
    const auto& address = peer_addresses_[static_cast<size_t>(peer)];
    if (!address.empty() && cause.find(address) != std::string::npos) peers.push_back(peer);
  }
  // The address is the peer's listening one only when this side connected;
  // with a single peer there is no doubt either way.
  if (peers.empty() && size() == 2 && cause.find("peer") != std::string::npos) {
    peers.push_back(1 - rank());
  }
  if (peers.empty()) return "";
  return fmt::format(" (the connection to rank {} broke: that rank probably exited or crashed; "
                     "its own output says why)",
                     fmt::join(peers, ", rank "));
}

void GlooGroup::run_allreduce(const Tensor& t, ReduceOp op, milliseconds timeout, uint32_t tag) {
  if (t.numel() == 0) return;
  ::gloo::AllreduceOptions o(context_);
  set_output(o, t);
  o.setReduceFunction(reduce_function(t.dtype(), op));
  o.setTag(tag);
  o.setTimeout(timeout);
  ::gloo::allreduce(o);
  if (op == ReduceOp::Avg) {
    divide_by(t.raw_data(), t.dtype(), static_cast<size_t>(t.numel()), size());
  }
}

std::shared_ptr<Work> GlooGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  check_tensor("allreduce", tensor);
  throw_if_aborted("allreduce");
  next_seq();
  const auto description = describe("allreduce", &tensor, to_string(opts.op));
  return enqueue(description, timeout_of(opts.timeout),
                 [this, t = tensor, op = opts.op](milliseconds timeout, uint32_t tag) {
                   run_allreduce(t, op, timeout, tag);
                 });
}

std::shared_ptr<Work> GlooGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  check_tensor("broadcast", tensor);
  check_root("broadcast", opts.root);
  throw_if_aborted("broadcast");
  next_seq();
  const auto description = describe("broadcast", &tensor, fmt::format("root {}", opts.root));
  return enqueue(description, timeout_of(opts.timeout),
                 [this, t = tensor, root = opts.root](milliseconds timeout, uint32_t tag) {
                   if (t.numel() == 0) return;
                   ::gloo::BroadcastOptions o(context_);
                   set_output(o, t);
                   o.setRoot(root);
                   o.setTag(tag);
                   o.setTimeout(timeout);
                   ::gloo::broadcast(o);
                 });
}

std::shared_ptr<Work> GlooGroup::reduce(Tensor& tensor, const ReduceOptions& opts) {
  check_tensor("reduce", tensor);
  check_root("reduce", opts.root);
  throw_if_aborted("reduce");
  next_seq();
  const auto description =
      describe("reduce", &tensor, fmt::format("{}, root {}", to_string(opts.op), opts.root));
  return enqueue(description, timeout_of(opts.timeout),
                 [this, t = tensor, op = opts.op, root = opts.root](milliseconds timeout,
                                                                    uint32_t tag) {
                   if (t.numel() == 0) return;
                   ::gloo::ReduceOptions o(context_);
                   set_output(o, t);
                   o.setRoot(root);
                   o.setReduceFunction(reduce_function(t.dtype(), op));
                   o.setTag(tag);
                   o.setTimeout(timeout);
                   ::gloo::reduce(o);
                   if (op == ReduceOp::Avg && rank() == root) {
                     divide_by(t.raw_data(), t.dtype(),
                                             static_cast<size_t>(t.numel()), size());
                   }
                 });
}

std::shared_ptr<Work> GlooGroup::allgather(Tensor& output, const Tensor& input,
                                           const AllgatherOptions& opts) {
  check_tensor("allgather", input);
  check_tensor("allgather", output);
  LOCKSTEP_CHECK(output.dtype() == input.dtype(),
                 "allgather on group '{}': output has dtype {} but input has {}; they must match",
                 name(), runtime::dtype_name(output.dtype()), runtime::dtype_name(input.dtype()));
  LOCKSTEP_CHECK(output.numel() == input.numel() * size(),
                 "allgather on group '{}': output has {} elements but needs size() * "
                 "input.numel() = {} * {} = {}",
                 name(), output.numel(), size(), input.numel(), input.numel() * size());
  throw_if_aborted("allgather");
  next_seq();
  const auto description = describe("allgather", &input, "");
  return enqueue(description, timeout_of(opts.timeout),
                 [this, out = output, in = input](milliseconds timeout, uint32_t tag) {
                   if (in.numel() == 0) return;
                   ::gloo::AllgatherOptions o(context_);
                   auto in_buffer = context_->createUnboundBuffer(in.raw_data(), nbytes(in));
                   with_element_type(in.element_size(), [&](auto e) {
                     o.template setInput<decltype(e)>(std::move(in_buffer));
                   });
                   set_output(o, out);
                   o.setTag(tag);
                   o.setTimeout(timeout);
                   ::gloo::allgather(o);
                 });
}

// reduce_scatter as an all-reduce of a copy of `input` followed by a copy of
// this rank's chunk: gloo's ReduceScatterHalvingDoubling is a bound-buffer
// algorithm without per-op timeouts or tags, and correctness comes first. It
// moves about twice the bytes a true reduce-scatter would.
std::shared_ptr<Work> GlooGroup::reduce_scatter(Tensor& output, const Tensor& input,
                                                const ReduceScatterOptions& opts) {
  check_tensor("reduce_scatter", input);
  check_tensor("reduce_scatter", output);
  LOCKSTEP_CHECK(output.dtype() == input.dtype(),
                 "reduce_scatter on group '{}': output has dtype {} but input has {}; they must "
                 "match",
                 name(), runtime::dtype_name(output.dtype()), runtime::dtype_name(input.dtype()));
  LOCKSTEP_CHECK(input.numel() == output.numel() * size(),
                 "reduce_scatter on group '{}': input has {} elements but needs size() * "
                 "output.numel() = {} * {} = {}",
                 name(), input.numel(), size(), output.numel(), output.numel() * size());
  throw_if_aborted("reduce_scatter");
  next_seq();
  const auto description = describe("reduce_scatter", &output, to_string(opts.op));
  return enqueue(description, timeout_of(opts.timeout),
                 [this, out = output, in = input, op = opts.op](milliseconds timeout,
                                                                 uint32_t tag) {
                   if (out.numel() == 0) return;
                   Tensor scratch = in.clone();
                   run_allreduce(scratch, op, timeout, tag);
                   const size_t chunk = nbytes(out);
                   std::memcpy(out.raw_data(),
                               static_cast<const char*>(scratch.raw_data()) + chunk * rank(),
                               chunk);
                 });
}

std::shared_ptr<Work> GlooGroup::barrier(const BarrierOptions& opts) {
  throw_if_aborted("barrier");
  next_seq();
  const auto description = describe("barrier", nullptr, "");
  return enqueue(description, timeout_of(opts.timeout),
                 [this](milliseconds timeout, uint32_t tag) {
                   ::gloo::BarrierOptions o(context_);
                   o.setTag(tag);
                   o.setTimeout(timeout);
                   ::gloo::barrier(o);
                 });
}

// Sends and recvs are posted to gloo at once, in issue order (which is what
// matches them with the peer's), and each is waited for on its own thread.
std::shared_ptr<Work> GlooGroup::post_p2p(std::string_view op, const Tensor& tensor, int peer,
                                          const SendRecvOptions& opts, bool is_send) {
  check_tensor(op, tensor);
  LOCKSTEP_CHECK(peer >= 0 && peer < size() && peer != rank(),
                 "{} on group '{}': peer {} must be another rank of this group of {} ranks (this "
                 "is rank {})",
                 op, name(), peer, size(), rank());
  LOCKSTEP_CHECK(opts.tag >= 0, "{} on group '{}': tag {} must be >= 0", op, name(), opts.tag);
  throw_if_aborted(op);
  const auto description = fmt::format("{} ({}, {} elements, {} rank {}, tag {})", op,
                                       runtime::dtype_name(tensor.dtype()), tensor.numel(),
                                       is_send ? "to" : "from", peer, opts.tag);
  const milliseconds timeout = timeout_of(opts.timeout);
  auto work = make_work(description, timeout);
  if (tensor.numel() == 0) {
    work->finish();
    return work;
  }
  auto buffer = context_->createUnboundBuffer(tensor.raw_data(), nbytes(tensor));
  if (is_send) {
    buffer->send(peer, p2p_slot(opts.tag));
  } else {
    buffer->recv(peer, p2p_slot(opts.tag));
  }
  std::lock_guard lock(mutex_);
  reap_p2p_locked();
  PendingP2p& p = p2p_.emplace_back();
  p.work = work;
  p.description = description;
  p.deadline = Clock::now() + timeout;
  p.buffer = std::move(buffer);
  p.tensor = tensor;
  p.is_send = is_send;
  p.waiter = std::thread([this, &p] { wait_p2p(p); });
  return work;
}

std::shared_ptr<Work> GlooGroup::send(const Tensor& tensor, int dst, const SendRecvOptions& opts) {
  return post_p2p("send", tensor, dst, opts, true);
}

std::shared_ptr<Work> GlooGroup::recv(Tensor& tensor, int src, const SendRecvOptions& opts) {
  return post_p2p("recv", tensor, src, opts, false);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<runtime::Store> store, int rank,
                                              int size, const std::string& name,
                                              std::chrono::milliseconds timeout,
                                              const std::string& bind_address) {
  return std::make_shared<GlooGroup>(std::move(store), rank, size, name, timeout, bind_address);
}

}  // namespace lockstep::collectives
