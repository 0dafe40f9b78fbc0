#include "lockstep/collectives/gloo/gloo_group.h"

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "lockstep/collectives/float_average.h"
#include "lockstep/collectives/gloo/gloo_call_check.h"
#include "lockstep/collectives/gloo/gloo_store_adapter.h"
#include "lockstep/collectives/p2p_text.h"
#include "lockstep/collectives/serial_executor.h"
#include "lockstep/collectives/reduce_kernels.h"
#include "lockstep/runtime/open_files.h"

namespace lockstep::collectives {
namespace {

using Clock = Work::Clock;
using std::chrono::milliseconds;
using ::gloo::transport::UnboundBuffer;

// Slots of send/recv: gloo's collectives use slot prefixes 0x01..0x08 in the
// top byte (gloo/types.h) and the call check 0x41 (gloo_call_check.cpp), so
// point-to-point traffic gets prefixes of its own.
// Every message is a header (the sender's dtype, count and message number)
// and then its data:
// a recv reads the header first, since gloo terminates the process when more
// bytes arrive than a recv posted, and leaves the rest of the tensor stale
// when fewer do. Data of at most kInlineBytes travels inside its header, in
// one message: a separate one costs a second round trip (the recv posts it
// only once the header has come), which doubled a small message's latency.
constexpr uint64_t kP2pDataPrefix = uint64_t{0x40} << 56;
constexpr uint64_t kP2pHeaderPrefix = uint64_t{0x42} << 56;
// The header crosses processes: change kWireProtocol with it
// (distributed/wire_protocol.h).
constexpr size_t kHeaderBytes = 3 * sizeof(int64_t);
constexpr size_t kInlineBytes = 4096;

// Descriptors a group opens beside its connections to the peers: the
// device's listening socket and event loop, with room to spare.
constexpr long kGlooOwnDescriptors = 8;

uint64_t header_slot(int tag) { return kP2pHeaderPrefix | static_cast<uint32_t>(tag); }

// The data of the `number`-th message (mod 2^24) a rank sends to a peer has
// a slot of its own, so a recv posts it once it has read the header (which
// carries the number), whatever the recvs issued after it do meanwhile. The
// sender numbers its messages to each peer whatever their tags: counted per
// tag, a run that tags each step's messages with the step kept a count for
// every tag it ever used.
uint64_t data_slot(int tag, uint64_t number) {
  return kP2pDataPrefix | ((number & 0xffffff) << 32) | static_cast<uint32_t>(tag);
}

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
    case 1: fn(uint8_t{}); return;  // u8, bool
    case 2: fn(uint16_t{}); return;
    case 4: fn(uint32_t{}); return;
    case 8: fn(uint64_t{}); return;
    default: LOCKSTEP_ASSERT(element_size == 1 || element_size == 2 || element_size == 4 ||
                             element_size == 8);
  }
}

// gloo's event loop spins while another thread holds a connection's lock
// (tcp::Pair::handleEvents only try-locks it). When data arriving for the
// loop woke it onto the core of a thread sending under that lock, it
// preempted the sender and spun until the next scheduler tick: 4 ms per
// collective with ranks bound to cores, about half the runs without. A
// SCHED_BATCH thread does not preempt on wake-up, so the loop runs when the
// sender blocks. Threads inherit their creator's policy; the scope sets it
// on this thread while the device (and with it the loop thread) is made.
class BatchPolicyScope {
 public:
  BatchPolicyScope() {
    sched_param param{};
    changed_ =
        sched_getscheduler(0) == SCHED_OTHER && sched_setscheduler(0, SCHED_BATCH, &param) == 0;
  }
  ~BatchPolicyScope() {
    sched_param param{};
    if (changed_) sched_setscheduler(0, SCHED_OTHER, &param);
  }
  BatchPolicyScope(const BatchPolicyScope&) = delete;
  BatchPolicyScope& operator=(const BatchPolicyScope&) = delete;

 private:
  bool changed_ = false;
};

size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

class GlooGroup final : public ProcessGroup {
 public:
  GlooGroup(std::shared_ptr<distributed::Store> store, int rank, int size, const std::string& name,
            milliseconds timeout, const std::string& bind_address);
  ~GlooGroup() override;

  std::string backend() const override { return "gloo"; }

 protected:
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
  void abort_peers(const std::string& reason) override;

 private:
  // A collective's data movement, after the call check, with the time left
  // before the deadline (gloo's own timeout for the op) and its gloo tag.
  using Body = std::function<void(milliseconds timeout, uint32_t tag)>;
  // A posted send or recv and the thread that waits for it. Each has its own
  // thread: waiting in issue order on one thread would deadlock a rank that
  // posts recv(tag 2), recv(tag 1) and then waits for send(tag 1).
  struct PendingP2p {
    std::shared_ptr<Work> work;
    Call call;
    // i64: the sender's dtype, element count and message number (a recv's:
    // what came), then room for data of at most kInlineBytes.
    Tensor header = Tensor::empty({(kHeaderBytes + kInlineBytes) / sizeof(int64_t)},
                                  runtime::DType::i64);
    std::unique_ptr<UnboundBuffer> header_buffer;
    std::unique_ptr<UnboundBuffer> data_buffer;  // null while there is none
    UnboundBuffer* waiting = nullptr;  // the one waited for; guarded by mutex_
    Tensor tensor;  // keeps the memory alive while gloo may touch it
    int peer = -1;
    int tag = 0;
    uint64_t number = 0;  // this message's among those the sender sent to its peer
    bool is_send;
    bool done = false;  // guarded by mutex_
    std::thread waiter;
  };

  void connect(const std::shared_ptr<distributed::Store>& store, const std::string& bind_address);
  void learn_peer_addresses(::gloo::rendezvous::Store& store);
  std::shared_ptr<Work> submit(Call call, Body body);
  std::shared_ptr<Work> post_p2p(const Call& call, const Tensor& tensor, int peer, int tag,
                                 bool is_send);
  void wait_p2p(PendingP2p& p);
  // Waits for `buffer`'s send or recv; false when it was cancelled.
  bool wait_buffer(PendingP2p& p, UnboundBuffer& buffer);
  // Cancels the waits of the sends and recvs not yet done; mutex_ held.
  void cancel_p2p_waits_locked();
  // Once a recv's header has come: posts the data's recv into the tensor, or
  // into scratch memory (so that the send completes) when the header does
  // not match the tensor; throws CollectiveError in that case after the data
  // came. False when the group is being destroyed.
  bool receive_data(PendingP2p& p);
  void reap_p2p_locked();
  // What posting a send or recv threw, rethrown: gloo's refusal to post on a
  // connection it saw break worded as fail_with() words a failed one, with
  // the group made unusable as after one.
  [[noreturn]] void fail_unposted(const Call& call, std::exception_ptr error, int peer);
  // What gloo threw, worded: a timeout becomes DeadlineExceeded, anything
  // else a CollectiveError naming the op, this rank, the broken peers and
  // why a peer gave up, where it said so. `peer`: a send's or recv's rank,
  // whose connection alone it uses; -1 for a collective.
  [[noreturn]] void fail_with(const Call& call, const std::exception& cause, int peer = -1);
  std::string name_broken_peers(const Call& call, const std::string& cause, int peer) const;
  std::string peer_abort_reason(const Call& call) const;

  template <class Options>
  void set_output(Options& o, const Tensor& t) {
    auto buffer = context_->createUnboundBuffer(t.raw_data(), nbytes(t));
    with_element_type(t.element_size(), [&](auto e) {
      o.template setOutput<decltype(e)>(std::move(buffer));
    });
  }
  void allreduce_data(const Tensor& t, ReduceOp op, milliseconds timeout, uint32_t tag);

  // Declared first so that it is destroyed last: buffers of failed sends and
  // recvs (with their tensors' memory), which gloo may still reference until
  // the context is gone.
  std::vector<std::pair<std::unique_ptr<UnboundBuffer>, Tensor>> graveyard_;
  std::shared_ptr<distributed::Store> store_;
  std::string abort_key_;  // where a rank that aborts the group says why
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  std::vector<std::string> peer_addresses_;  // gloo's address string of each peer's pair
  std::unique_ptr<gloo_backend::GlooCallCheck> check_;
  std::shared_ptr<SerialExecutor> executor_;

  std::mutex mutex_;
  std::list<PendingP2p> p2p_;
  // Messages sent so far to each peer; guarded by mutex_.
  std::vector<uint64_t> sent_to_;
  bool stopping_ = false;  // the group is being destroyed
  bool aborted_ = false;   // abort() ran on this rank
};

GlooGroup::GlooGroup(std::shared_ptr<distributed::Store> store, int rank, int size,
                     const std::string& name, milliseconds timeout,
                     const std::string& bind_address)
    : ProcessGroup(rank, size, name, timeout), store_(store),
      sent_to_(static_cast<size_t>(std::max(size, 0))) {
  LOCKSTEP_CHECK(store != nullptr, "gloo group '{}': a store is needed for the rendezvous", name);
  connect(store, bind_address);
  check_ = std::make_unique<gloo_backend::GlooCallCheck>(context_, rank, size);
  // Calls run on the worker only (gloo's latency dwarfs the hand-off), so a
  // waiting thread is free to report a stall, naming whom the check waits for.
  executor_ = std::make_shared<SerialExecutor>(SerialExecutor::Hooks{
      .where = where(),
      .abort = abort_state(),
      .fail = [this](const std::string& reason) { abort(reason); },
      .waiting_on = [this] { return check_->waiting_on(); },
      .run_on_waiter = false,
  });
  executor_->start();
}

GlooGroup::~GlooGroup() {
  executor_->stop();  // a collective already inside gloo finishes or reaches its deadline
  std::list<PendingP2p> p2p;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    cancel_p2p_waits_locked();  // their Work fails
    p2p.splice(p2p.end(), p2p_);
  }
  for (auto& p : p2p) p.waiter.join();
}

// Rendezvous: every rank publishes its gloo addresses under a per-group
// prefix of the store and connects to every other rank (a full mesh). The
// prefix carries a count of this rank's groups of the same name, so a group
// made again under an old name does not read the previous one's addresses.
void GlooGroup::connect(const std::shared_ptr<distributed::Store>& store,
                        const std::string& bind_address) {
  // Past the open-file limit gloo fails with "Unable to find address" or a
  // connect error that hides the EMFILE behind it.
  const long needed = size() - 1 + kGlooOwnDescriptors;
  const auto room = runtime::make_room_for_descriptors(needed);
  LOCKSTEP_CHECK(room.enough,
                 "gloo: rank {} of group '{}' ({} ranks) needs about {} more open files (a "
                 "connection to each peer, and {} of its own) beside the {} it has open, but its "
                 "open-file limit is {} and the hard limit {} (ulimit -n, ulimit -Hn): raise the "
                 "limit (nofile in /etc/security/limits.conf), or start fewer ranks",
                 rank(), name(), size(), needed, kGlooOwnDescriptors, room.open, room.soft,
                 room.hard);
  try {
    const int64_t instance = store->add(fmt::format("{}/gloo/instances/{}", name(), rank()), 1);
    abort_key_ = fmt::format("{}/gloo/{}/abort", name(), instance);
    gloo_backend::GlooStoreAdapter adapter(store, fmt::format("{}/gloo/{}/", name(), instance),
                                           timeout());
    ::gloo::transport::tcp::attr attr;
    attr.hostname = bind_address;
    {
      BatchPolicyScope batch;  // the device's event loop thread inherits it
      device_ = ::gloo::transport::tcp::CreateDevice(attr);
    }
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

// In issue order on the worker (the same order on every rank, so gloo's
// tags match): the call check, then the data movement.
std::shared_ptr<Work> GlooGroup::submit(Call call, Body body) {
  return executor_->submit(std::move(call), [this, body = std::move(body)](const Call& c) {
    try {
      check_->check(c);
      const auto left = std::chrono::ceil<milliseconds>(c.deadline - Clock::now());
      body(std::max(left, milliseconds(1)), static_cast<uint32_t>(c.signature.seq));
    } catch (const CollectiveError&) {
      throw;
    } catch (const DeadlineExceeded&) {
      throw;
    } catch (const std::exception& e) {
      fail_with(c, e);
    }
  });
}

// Sends and recvs still waited for stop waiting, and those about to wait
// find `stopping_` or `aborted_` set (wait_buffer).
void GlooGroup::cancel_p2p_waits_locked() {
  for (auto& p : p2p_) {
    if (p.done || p.waiting == nullptr) continue;
    if (p.is_send) p.waiting->abortWaitSend(); else p.waiting->abortWaitRecv();
  }
}

// A rank that aborts says why in the store, then closes its connections:
// peers waiting on it fail at once (their error reads the reason back).
// This rank's own sends and recvs fail at once too: closing the connections
// does not end gloo's wait for them, which lasted until their timeout.
void GlooGroup::abort_peers(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    cancel_p2p_waits_locked();
  }
  check_->abort();  // a collective waiting in its call check for a rank that never comes
  try {
    store_->compare_set(abort_key_, {},
                        distributed::to_bytes(fmt::format("{}\n{}", rank(), reason)));
  } catch (const std::exception&) {
    // The store may be gone too; closing the connections still tells the peers.
  }
  context_->closeConnections();
}

bool GlooGroup::wait_buffer(PendingP2p& p, UnboundBuffer& buffer) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || aborted_) return false;
    p.waiting = &buffer;
  }
  const auto left = std::chrono::ceil<milliseconds>(p.call.deadline - Clock::now());
  const milliseconds timeout = left.count() > 0 ? left : milliseconds(1);
  return p.is_send ? buffer.waitSend(timeout) : buffer.waitRecv(timeout);
}

bool GlooGroup::receive_data(PendingP2p& p) {
  const auto* header = static_cast<const int64_t*>(p.header.raw_data());
  const auto dtype = static_cast<runtime::DType>(header[0]);
  const int64_t count = header[1];
  p.number = static_cast<uint64_t>(header[2]);
  const bool fits = dtype == p.tensor.dtype() && count == p.tensor.numel();
  const auto bytes = static_cast<size_t>(count) * runtime::dtype_size(dtype);
  if (bytes <= kInlineBytes) {  // came inside the header
    if (fits && bytes > 0)
      std::memcpy(p.tensor.raw_data(), static_cast<const char*>(p.header.raw_data()) + kHeaderBytes,
                  bytes);
  } else {
    // A message that does not fit still arrives whole, so its send completes.
    const Tensor into =
        fits ? p.tensor : Tensor::empty({static_cast<int64_t>(bytes)}, runtime::DType::u8);
    p.data_buffer = context_->createUnboundBuffer(into.raw_data(), nbytes(into));
    if (!fits) p.tensor = into;
    p.data_buffer->recv(p.peer, data_slot(p.tag, p.number));
    if (!wait_buffer(p, *p.data_buffer)) return false;
  }
  if (!fits) {
    throw CollectiveError(fmt::format(
        "{} on {}: rank {} sent {} elements of {}; send and recv must use tensors of the same "
        "size and dtype (the message was dropped)",
        p.call.description(), where(), p.peer, count, runtime::dtype_name(dtype)));
  }
  return true;
}

void GlooGroup::wait_p2p(PendingP2p& p) {
  std::exception_ptr error;
  try {
    bool done = wait_buffer(p, *p.header_buffer);
    if (done && p.is_send) {
      done = p.data_buffer == nullptr || wait_buffer(p, *p.data_buffer);
    } else if (done) {
      done = receive_data(p);
    }
    if (!done) {
      const bool destroyed = [&] {
        std::lock_guard lock(mutex_);
        return stopping_;
      }();
      error = std::make_exception_ptr(CollectiveError(
          destroyed ? fmt::format("{} on {} was cancelled: the group was destroyed first",
                                  p.call.description(), where())
                    : fmt::format("{} on {} was cancelled: the group was aborted because {}",
                                  p.call.description(), where(), unusable_reason())));
    }
  } catch (const CollectiveError&) {
    error = std::current_exception();  // a mismatched message: the group is still in step
  } catch (const std::exception& e) {
    try {
      if (std::string_view(e.what()).find("Timed out") != std::string_view::npos) {
        // Not fail_with's wording: no call check ran, so nothing says the
        // peer came; only that no matching call of its came in time.
        throw DeadlineExceeded(p2p_timeout_detail(p.is_send, p.peer, p.tag));
      }
      fail_with(p.call, e, p.peer);
    } catch (const DeadlineExceeded& timeout_error) {
      const std::string message = timeout_message(p.call, timeout_error.what());
      abort(message);
      error = std::make_exception_ptr(CollectiveError(message));
    } catch (const CollectiveError& failure) {
      abort(failure.what());
      error = std::current_exception();
    }
  }
  std::shared_ptr<Work> work = std::move(p.work);
  {
    std::lock_guard lock(mutex_);
    if (error) {
      graveyard_.emplace_back(std::move(p.data_buffer), p.tensor);
      graveyard_.emplace_back(std::move(p.header_buffer), p.header);
    }
    // gloo is done with the memory: the caller's tensor is freed when the
    // caller drops it, not when the next send or recv reaps this entry.
    p.data_buffer.reset();
    p.header_buffer.reset();
    p.waiting = nullptr;
    p.tensor = Tensor();
    p.header = Tensor();
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

void GlooGroup::fail_with(const Call& call, const std::exception& cause, int peer) {
  const std::string what = cause.what();
  if (what.find("Timed out") != std::string::npos) {
    throw DeadlineExceeded(fmt::format(
        "every rank joined it, but its data did not finish moving in time (gloo: {})", what));
  }
  throw CollectiveError(fmt::format("{} failed on {}: {}{}{}", call.description(), where(), what,
                                    name_broken_peers(call, what, peer), peer_abort_reason(call)));
}

// gloo's words for a connection that failed (transport/tcp/pair.cc):
// "Connection closed by peer", "Read error ...: Connection reset by peer",
// "Socket closed", "Socket unexpectedly closed", a write's "Broken pipe".
bool is_connection_error(const std::string& cause) {
  for (const char* words : {"peer", "Socket", "closed", "Broken pipe", "Read error",
                            "Write error"}) {
    if (cause.find(words) != std::string::npos) return true;
  }
  return false;
}

std::string GlooGroup::name_broken_peers(const Call& call, const std::string& cause,
                                         int peer) const {
  std::vector<int> peers;
  for (int q = 0; q < size(); ++q) {
    const auto& address = peer_addresses_[static_cast<size_t>(q)];
    if (!address.empty() && cause.find(address) != std::string::npos) peers.push_back(q);
  }
  // The address is the peer's listening one only when this side connected
  // (gloo picks the side by comparing the two addresses, so by chance); with
  // a single peer (a send's or recv's, or the other of two ranks) there is
  // no doubt either way.
  if (peer < 0 && size() == 2) peer = 1 - rank();
  if (peers.empty() && peer >= 0 && is_connection_error(cause)) {
    peers.push_back(peer);
  }
  if (peers.empty()) return "";
  // Named as the caller knows them: a composite's member call carries its ranks.
  std::vector<std::string> names;
  for (int q : peers) names.push_back(call.rank_name(q));
  return fmt::format(" (the connection to {} broke: that rank probably exited, crashed or "
                     "gave up on the group; its own output says why)",
                     fmt::join(names, ", "));
}

// A peer that aborted the group left its rank and reason in the store just
// before it closed its connections. The rank is named as the caller knows it:
// a composite's member group names the composite's rank.
std::string GlooGroup::peer_abort_reason(const Call& call) const {
  try {
    store_->wait({abort_key_}, milliseconds(200));
    const std::string value = distributed::to_string(store_->get(abort_key_));
    const size_t newline = value.find('\n');
    if (newline == std::string::npos) return "";
    return fmt::format("; the group was aborted by {}: {}",
                       call.rank_name(std::stoi(value.substr(0, newline))),
                       value.substr(newline + 1));
  } catch (const std::exception&) {
    return "";
  }
}

void GlooGroup::allreduce_data(const Tensor& tensor, ReduceOp op, milliseconds timeout,
                               uint32_t tag) {
  if (tensor.numel() == 0) return;
  const Tensor t = in_reduction_dtype(tensor, op);
  ::gloo::AllreduceOptions o(context_);
  set_output(o, t);
  o.setReduceFunction(reduce_function(t.dtype(), op));
  o.setTag(tag);
  o.setTimeout(timeout);
  ::gloo::allreduce(o);
  if (op == ReduceOp::Avg) {
    divide_by(t.raw_data(), t.dtype(), static_cast<size_t>(t.numel()), size());
  }
  write_back(tensor, t);
}

std::shared_ptr<Work> GlooGroup::run_allreduce(Call call, Tensor& tensor, ReduceOp op) {
  return submit(std::move(call), [this, t = tensor, op](milliseconds timeout, uint32_t tag) {
    allreduce_data(t, op, timeout, tag);
  });
}

std::shared_ptr<Work> GlooGroup::run_broadcast(Call call, Tensor& tensor, int root) {
  return submit(std::move(call), [this, t = tensor, root](milliseconds timeout, uint32_t tag) {
    if (t.numel() == 0) return;
    ::gloo::BroadcastOptions o(context_);
    set_output(o, t);
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout);
    ::gloo::broadcast(o);
  });
}

std::shared_ptr<Work> GlooGroup::run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                            int root) {
  return submit(std::move(call), [this, tensor, op, root](milliseconds timeout, uint32_t tag) {
    if (tensor.numel() == 0) return;
    const Tensor t = in_reduction_dtype(tensor, op);
    ::gloo::ReduceOptions o(context_);
    set_output(o, t);
    o.setRoot(root);
    o.setReduceFunction(reduce_function(t.dtype(), op));
    o.setTag(tag);
    o.setTimeout(timeout);
    ::gloo::reduce(o);
    if (op == ReduceOp::Avg && rank() == root) {
      divide_by(t.raw_data(), t.dtype(), static_cast<size_t>(t.numel()), size());
    }
    write_back(tensor, t);
  });
}

std::shared_ptr<Work> GlooGroup::run_allgather(Call call, Tensor& output,
                                               const Tensor& input) {
  return submit(std::move(call), [this, out = output, in = input](milliseconds timeout, uint32_t tag) {
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
std::shared_ptr<Work> GlooGroup::run_reduce_scatter(Call call, Tensor& output,
                                                    const Tensor& input, ReduceOp op) {
  return submit(std::move(call), [this, out = output, in = input, op](milliseconds timeout, uint32_t tag) {
    if (out.numel() == 0) return;
    const Tensor wide = in_reduction_dtype(in, op);
    Tensor scratch = wide.is_same(in) ? in.clone() : wide;
    allreduce_data(scratch, op, timeout, tag);
    const int64_t n = out.numel();
    const Tensor mine = scratch.flatten().slice(0, n * rank(), n * (rank() + 1));
    if (mine.dtype() == out.dtype()) {
      std::memcpy(out.raw_data(), mine.raw_data(), nbytes(out));
    } else {
      write_back(out, mine);
    }
  });
}

// The call check is itself a barrier: every rank's signature has come.
std::shared_ptr<Work> GlooGroup::run_barrier(Call call) {
  return submit(std::move(call), [](milliseconds, uint32_t) {});
}

// Sends and recvs are posted to gloo at once, in issue order (which is what
// matches them with the peer's), and each is waited for on its own thread.
std::shared_ptr<Work> GlooGroup::post_p2p(const Call& call, const Tensor& tensor, int peer,
                                          int tag, bool is_send) {
  // The waiter thread words the timeout (naming the peer) and aborts the
  // group before it fails the Work; wait() gives up by itself only if that
  // thread is stuck, after a grace.
  auto work = std::make_shared<Work>(call.description(),
                                     call.deadline + SerialExecutor::kWorkerGrace,
                                     timeout_message(call));
  std::unique_lock lock(mutex_);
  reap_p2p_locked();
  PendingP2p& p = p2p_.emplace_back();
  p.work = work;
  p.call = call;
  p.tensor = tensor;
  p.peer = peer;
  p.tag = tag;
  p.is_send = is_send;
  std::exception_ptr unposted;
  try {
    if (is_send) {
      auto* header = static_cast<int64_t*>(p.header.raw_data());
      header[0] = static_cast<int64_t>(tensor.dtype());
      header[1] = tensor.numel();
      p.number = sent_to_[static_cast<size_t>(peer)]++;
      header[2] = static_cast<int64_t>(p.number);
      const size_t bytes = nbytes(tensor);
      const bool inline_data = bytes <= kInlineBytes;
      if (inline_data && bytes > 0)
        std::memcpy(static_cast<char*>(p.header.raw_data()) + kHeaderBytes, tensor.raw_data(),
                    bytes);
      p.header_buffer = context_->createUnboundBuffer(p.header.raw_data(),
                                                      kHeaderBytes + (inline_data ? bytes : 0));
      p.header_buffer->send(peer, header_slot(tag));
      if (!inline_data) {
        p.data_buffer = context_->createUnboundBuffer(tensor.raw_data(), bytes);
        p.data_buffer->send(peer, data_slot(tag, p.number));
      }
    } else {
      // Room for the largest header, data inside it included.
      p.header_buffer = context_->createUnboundBuffer(p.header.raw_data(), nbytes(p.header));
      p.header_buffer->recv(peer, header_slot(tag));
    }
  } catch (...) {
    // Not posted, or only in part: no waiter thread to join.
    graveyard_.emplace_back(std::move(p.header_buffer), p.header);
    graveyard_.emplace_back(std::move(p.data_buffer), p.tensor);
    p2p_.pop_back();
    unposted = std::current_exception();
  }
  if (unposted) {
    lock.unlock();  // aborting the group wakes waiters that take the lock
    fail_unposted(call, unposted, peer);
  }
  p.waiter = std::thread([this, &p] { wait_p2p(p); });
  return work;
}

void GlooGroup::fail_unposted(const Call& call, std::exception_ptr error, int peer) {
  try {
    std::rethrow_exception(error);
  } catch (const ::gloo::IoException& e) {
    try {
      fail_with(call, e, peer);
    } catch (const std::exception& failure) {
      abort(failure.what());
      throw;
    }
  }
}

std::shared_ptr<Work> GlooGroup::run_send(Call call, const Tensor& tensor, int dst,
                                          int tag) {
  return post_p2p(call, tensor, dst, tag, true);
}

std::shared_ptr<Work> GlooGroup::run_recv(Call call, Tensor& tensor, int src, int tag) {
  return post_p2p(call, tensor, src, tag, false);
}

// gloo writes to its sockets with writev(), which raises SIGPIPE when the
// peer's process has gone: its default action killed this rank ("killed by
// SIGPIPE") before gloo's error, which names the peer, could be thrown.
// PyTorch never meets it, as Python ignores SIGPIPE; so does a process with a
// gloo group, unless the program chose its own handling of it.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<distributed::Store> store, int rank,
                                              int size, const std::string& name,
                                              std::chrono::milliseconds timeout,
                                              const std::string& bind_address) {
  ignore_sigpipe_unless_handled();
  return std::make_shared<GlooGroup>(std::move(store), rank, size, name, timeout, bind_address);
}

}  // namespace lockstep::collectives
