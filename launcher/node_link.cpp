#include "launcher/node_link.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "launcher/options.h"
#include "lockstep/distributed/exit_status.h"

namespace lockstep::launcher {
namespace {

const std::string kDoneKey = "lockstep-run/nodes-done";
const std::string kJobIdKey = "lockstep-run/job-id";
// Set before the job id, which tells the other nodes they are there.
const std::string kShapeKey = "lockstep-run/shape";
const std::string kMasterPortKey = "lockstep-run/master-port";
// Node 0's --node-timeout, in ms: every node watches with it.
const std::string kNodeTimeoutKey = "lockstep-run/node-timeout-ms";
// A counter (read with add(0), which never blocks) and, beside it, why.
const std::string kStopKey = "lockstep-run/stop";
const std::string kStopWhyKey = "lockstep-run/stop-why";
constexpr auto kPollInterval = std::chrono::milliseconds(200);
constexpr auto kBeatInterval = std::chrono::milliseconds(250);
// How long the watcher waits for an answer past its poll before it asks again
// (on a new connection): short, so that node 0's silence is measured against
// --node-timeout, not the store client's default grace.
constexpr auto kWatchGrace = std::chrono::seconds(1);
// How long a launcher told to stop waits for node 0's answer to each call: it
// tells the other nodes what it can while its ranks stop, and then ends.
constexpr auto kStoppingAnswerWait = std::chrono::milliseconds(2000);

std::string launcher_key(int node) { return fmt::format("lockstep-run/node-{}/launcher", node); }
std::string beat_key(int node) { return fmt::format("lockstep-run/node-{}/beat", node); }
// Set when the node's launcher ends after success: its beat stops then.
std::string done_key(int node) { return fmt::format("lockstep-run/node-{}/done", node); }

bool interrupted() { return pending_stop_signal() != 0; }

}  // namespace

int pending_stop_signal() {
  sigset_t pending;
  sigpending(&pending);
  for (int sig : {SIGINT, SIGTERM, SIGHUP})
    if (sigismember(&pending, sig)) return sig;
  return 0;
}

NodeLink::NodeLink(distributed::TcpStoreOptions store, int node_rank, int num_nodes,
                   std::chrono::milliseconds silent_after)
    : node_rank_(node_rank), num_nodes_(num_nodes), silent_after_(silent_after) {
  // Node 0's launcher may start later than this one: say so while waiting,
  // and stop waiting when told to.
  store.report_waiting_every = std::chrono::seconds(10);
  store.who = fmt::format("node {}'s launcher", node_rank);
  store.give_up = [] {
    const int sig = pending_stop_signal();
    return sig == 0 ? std::string() : "received " + distributed::signal_name(sig);
  };
  // Node 0 answers at once while it is there: a call it leaves unanswered
  // for silent_after fails then (node 0 is lost, as the watcher would say),
  // instead of holding this launcher, deaf to signals, for minutes.
  distributed::TcpStoreOptions calls = store;
  calls.timeout = silent_after;
  calls.reply_grace = silent_after;
  store_ = std::make_unique<distributed::TcpStore>(calls);
  distributed::TcpStoreOptions watching = store;
  watching.timeout = std::chrono::seconds(2);  // its calls answer at once when node 0 is there
  watching.reply_grace = kWatchGrace;
  // A signal is the main thread's to act on; the watcher stops when told to.
  watching.give_up = [this] { return stop_ ? std::string("the launcher stops watching") : ""; };
  watcher_ = std::make_unique<distributed::TcpStore>(watching);
  if (node_rank_ != 0) {
    // Quiet, and never holding up the launcher's end: a store that does not
    // answer (node 0's host down) is the watcher's to report.
    distributed::TcpStoreOptions beats = store;
    beats.report_waiting_every = std::chrono::milliseconds(0);
    beats.timeout = std::chrono::seconds(2);
    beats.give_up = [this] { return stop_beating_ ? std::string("the launcher ends") : ""; };
    beater_ = std::make_unique<distributed::TcpStore>(beats);
  }
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  LOCKSTEP_CHECK(event_fd_ >= 0, "eventfd failed: {}", std::strerror(errno));
  thread_ = std::thread([this] { watch(); });
}

NodeLink::~NodeLink() {
  stop_watching();
  stop_beating_ = true;
  if (beat_thread_.joinable()) beat_thread_.join();
  close(event_fd_);
}

// Attempt 0 keeps the key of launchers without restarts.
std::string NodeLink::failure_key() const {
  return attempt_ == 0 ? "lockstep-run/failure"
                       : fmt::format("lockstep-run/attempt-{}/failure", attempt_);
}

bool NodeLink::is_attempt_key(const std::string& key, int attempt) {
  if (attempt == 0 && key == "lockstep-run/failure") return true;
  return key.starts_with(fmt::format("lockstep-run/attempt-{}/", attempt));
}

void NodeLink::stop_watching() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

// Until the launcher ends: a store that stops answering is the watcher's to
// report, so a failed beat is only tried again.
void NodeLink::beat() {
  while (!stop_beating_) {
    try {
      beater_->add(beat_key(node_rank_), 1);
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(kBeatInterval);
  }
}

std::string NodeLink::silent_node(distributed::TcpStore& s, const std::vector<int>& nodes) {
  const auto now = std::chrono::steady_clock::now();
  beats_.resize(static_cast<size_t>(num_nodes_));
  for (int n : nodes) {
    if (n == 0 || n == node_rank_) continue;  // node 0 serves the store, and does not beat
    Beats& b = beats_[static_cast<size_t>(n)];
    const int64_t count = s.add(beat_key(n), 0);
    // A node not joined yet (count 0) is left to the ranks' rendezvous.
    if (count == 0 || count != b.count) {
      b = {count, now};
      continue;
    }
    const std::chrono::milliseconds silent_after = silent_after_;
    if (now - b.since < silent_after || s.add(done_key(n), 0) > 0) continue;
    return fmt::format(
        "node {}'s launcher ({}) has not been heard from for {} s (--node-timeout {:g}): it was "
        "killed, or its host is down or cut off; its ranks are gone or cannot be reached",
        n, s.get_string(launcher_key(n)),
        std::chrono::duration_cast<std::chrono::seconds>(now - b.since).count(),
        std::chrono::duration<double>(silent_after).count());
  }
  return {};
}

void NodeLink::watch() {
  const std::string key = failure_key();
  // Node 0 watches the other nodes' launchers beat; a silent one fails the job.
  std::vector<int> others;
  if (node_rank_ == 0)
    for (int n = 1; n < num_nodes_; ++n) others.push_back(n);
  // A store that has answered nothing (each try gives up after kWatchGrace,
  // or a reconnect after 2 s) for silent_after_ is lost: node 0's host is
  // down or cut off, or its launcher stopped, without closing the connection.
  // Node 0 calls this node gone after as long without its beats.
  auto heard = std::chrono::steady_clock::now();
  while (!stop_) {
    try {
      if (const std::string silent = silent_node(*watcher_, others); !silent.empty()) {
        notify(distributed::to_string(watcher_->compare_set(
            key, {}, distributed::to_bytes(fmt::format("node {}: {}", node_rank_, silent)))));
        return;
      }
      watcher_->wait({key}, kPollInterval);
      notify(watcher_->get_string(key));
      return;
    } catch (const distributed::StoreUnreachable& e) {
      const std::chrono::milliseconds silent_after = silent_after_;
      const auto unheard = std::chrono::steady_clock::now() - heard;
      if (unheard < silent_after) continue;
      store_lost_ = true;
      if (!stop_)
        notify(fmt::format(
            "lost the job's store: node 0's launcher has not answered for {} s (--node-timeout "
            "{:g}; its host down or cut off, or the launcher stopped?): {}",
            std::chrono::duration_cast<std::chrono::seconds>(unheard).count(),
            std::chrono::duration<double>(silent_after).count(), e.what()));
      return;
    } catch (const distributed::StoreTimeout&) {
      // Answered, with nothing yet; look again unless asked to stop.
      heard = std::chrono::steady_clock::now();
    } catch (const std::exception& e) {
      store_lost_ = true;
      if (!stop_) notify(fmt::format("lost the job's store (node 0's launcher ended?): {}", e.what()));
      return;
    }
  }
}

// Once the watcher found the store lost, the other calls fail at once
// instead of each waiting out its timeout on a server that does not answer.
distributed::TcpStore& NodeLink::store() {
  if (store_lost_)
    throw Error(remote_failure());
  return *store_;
}

void NodeLink::notify(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remote_failure_ = what;
  }
  const uint64_t one = 1;
  const ssize_t ignored = write(event_fd_, &one, sizeof one);
  (void)ignored;
}

// Every node calls another gone after node 0's --node-timeout: one node
// that watched with its own would tell a stalled node from a lost one
// differently from the rest.
void NodeLink::adopt_node0_timeout() {
  try {
    store().wait({kNodeTimeoutKey}, std::chrono::milliseconds(0));
  } catch (const distributed::StoreUnreachable&) {
    throw;
  } catch (const distributed::StoreTimeout&) {
    if (interrupted()) throw;  // no answer heard: told to stop
    return;  // a node 0 from before the option: each node keeps its own
  }
  const std::chrono::milliseconds node0(std::stoll(store().get_string(kNodeTimeoutKey)));
  const std::chrono::milliseconds mine = silent_after_.exchange(node0);
  store_->set_timeout(node0);  // how long this launcher's calls wait for node 0's answer
  if (mine != node0)
    fmt::print(stderr,
               "lockstep-run: node {}: node 0's --node-timeout {:g} counts on every node; this "
               "launcher's {:g} is not used\n",
               node_rank_, std::chrono::duration<double>(node0).count(),
               std::chrono::duration<double>(mine).count());
}

NodeLink::Job NodeLink::agree_job(const Job& mine, const std::string& shape,
                                  std::chrono::milliseconds timeout) {
  claim_node(mine.id);
  if (beater_ != nullptr && !beat_thread_.joinable())
    beat_thread_ = std::thread([this] { beat(); });
  std::string node0_shape;
  try {
    if (node_rank_ == 0) {
      store().set(kShapeKey, distributed::to_bytes(shape));
      store().set(kMasterPortKey, distributed::to_bytes(std::to_string(mine.master_port)));
      store().set(kNodeTimeoutKey,
                  distributed::to_bytes(std::to_string(silent_after_.load().count())));
      store().set(kJobIdKey, distributed::to_bytes(mine.id));
      return mine;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!interrupted() && std::chrono::steady_clock::now() < deadline) {
      try {
        store().wait({kJobIdKey}, kPollInterval);
      } catch (const distributed::StoreTimeout&) {
        continue;
      }
      node0_shape = store().get_string(kShapeKey);
      if (node0_shape != shape) break;
      adopt_node0_timeout();
      return {.id = store().get_string(kJobIdKey),
              .master_port = std::stoi(store().get_string(kMasterPortKey))};
    }
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot agree on the job's id through node 0's store: {}", e.what()));
  }
  if (!node0_shape.empty()) {
    const std::string why = fmt::format(
        "its launcher was started with {}, node 0's with {}; give every node's launcher the "
        "same --nnodes, --nproc-per-node, --max-restarts and -x MASTER_PORT",
        shape, node0_shape);
    publish_stop(why);
    publish_failure(why);
    throw UsageError(fmt::format("node {}: {}", node_rank_, why));
  }
  throw Error(fmt::format("node 0's launcher did not publish the job's id within {} s (or this "
                          "launcher was told to stop); is node 0's launcher running?",
                          std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
}

void NodeLink::claim_node(const std::string& mine) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  const std::string me = fmt::format("host {}, pid {}, job id {}", host, getpid(), mine);
  const std::string key = launcher_key(node_rank_);
  std::string holder;
  try {
    // compare_set, not add: a request retried after a reconnect finds its own claim.
    holder = distributed::to_string(store().compare_set(key, {}, distributed::to_bytes(me)));
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot join the job through node 0's store: {}", e.what()));
  }
  if (holder == me) return;
  // Nothing is published: this launcher's failure is not the running job's.
  throw UsageError(fmt::format(
      "node {}: another launcher ({}) already joined the job of node 0's store as node {}, so "
      "this one would run a second copy of its ranks; two launches were given the same "
      "--master-addr, --master-port and token. Start each node's launcher once, and give "
      "another job its own --master-port",
      node_rank_, holder, node_rank_));
}

std::string NodeLink::unheard_because(const std::exception& e) const {
  if (dynamic_cast<const distributed::StoreUnreachable*>(&e) == nullptr) return e.what();
  return fmt::format("node 0's launcher does not answer at {} (its host down or cut off, or the "
                     "launcher stopped?)",
                     store_->address());
}

std::string NodeLink::remote_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remote_failure_;
}

void NodeLink::publish_failure(const std::string& what) {
  try {
    store().compare_set(failure_key(), {},
                        distributed::to_bytes(fmt::format("node {}: {}", node_rank_, what)));
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: could not tell the other nodes: {}\n", unheard_because(e));
  }
}

void NodeLink::publish_stop(const std::string& why) {
  // From now on node 0 gets a moment, not --node-timeout, to answer each call.
  store_->set_timeout(std::min(store_->timeout(), kStoppingAnswerWait));
  try {
    store().compare_set(kStopWhyKey, {},
                        distributed::to_bytes(fmt::format("node {}: {}", node_rank_, why)));
    store().add(kStopKey, 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: could not tell the other nodes to stop: {}\n",
               unheard_because(e));
  }
}

bool NodeLink::agree_to_restart(int attempt, std::chrono::milliseconds timeout) {
  stop_watching();
  const std::string stopped = fmt::format("lockstep-run/attempt-{}/stopped", attempt);
  const auto node_key = [&](int n) {
    return fmt::format("lockstep-run/attempt-{}/stopped-node-{}", attempt, n);
  };
  std::string missing, silent;
  try {
    store().add(node_key(node_rank_), 1);
    store().add(stopped, 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (store().add(kStopKey, 0) > 0) {
        fmt::print(stderr, "lockstep-run: not restarting: {}\n", store().get_string(kStopWhyKey));
        return false;
      }
      if (store().add(stopped, 0) >= num_nodes_) break;
      if (interrupted()) return false;  // main reads the signal and says so
      std::vector<int> waiting_for;
      for (int n = 0; n < num_nodes_; ++n)
        if (store().add(node_key(n), 0) == 0) waiting_for.push_back(n);
      silent = silent_node(store(), waiting_for);
      if (!silent.empty()) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        for (int n = 0; n < num_nodes_; ++n)
          if (store().add(node_key(n), 0) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
        break;
      }
      std::this_thread::sleep_for(kPollInterval / 4);
    }
  } catch (const std::exception& e) {
    if (interrupted()) return false;  // told to stop while node 0 was slow to answer
    throw Error(fmt::format(
        "the job's store is gone ({}): it lives in node 0's launcher, so the job ends. "
        "Restarting after node 0 is lost would need the store kept outside it (on a host of "
        "its own, or replicated), which lockstep-run does not do",
        unheard_because(e)));
  }
  if (!silent.empty())
    throw Error(fmt::format("the job cannot restart as a whole: {}", silent));
  if (!missing.empty())
    throw Error(fmt::format(
        "node(s) {} did not report their ranks stopped within {} s after the failure, so the "
        "job cannot restart as a whole; their launchers may be gone (check those hosts)",
        missing, std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
  // Watch the next attempt's failures, from a clean slate.
  uint64_t drained = 0;
  while (read(event_fd_, &drained, sizeof drained) > 0) {
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remote_failure_.clear();
  }
  attempt_ = attempt + 1;
  stop_ = false;
  thread_ = std::thread([this] { watch(); });
  return true;
}

bool NodeLink::attempt_succeeded_everywhere(std::chrono::milliseconds timeout) {
  const std::string done = fmt::format("lockstep-run/attempt-{}/done", attempt_);
  store().add(done, 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline && !interrupted()) {
    if (!remote_failure().empty()) return false;
    if (store().add(done, 0) >= num_nodes_) return true;
    std::this_thread::sleep_for(kPollInterval / 4);
  }
  return remote_failure().empty();
}

namespace {
std::string postmortem_key(int attempt, int node) {
  return fmt::format("lockstep-run/attempt-{}/postmortem/{}", attempt, node);
}
}  // namespace

void NodeLink::publish_postmortem(int attempt, const std::string& part) {
  try {
    store().set(postmortem_key(attempt, node_rank_), part);
  } catch (const std::exception& e) {
    throw Error(unheard_because(e));
  }
}

std::vector<std::string> NodeLink::collect_postmortems(int attempt,
                                                       std::chrono::milliseconds timeout) {
  std::vector<std::string> parts;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int node = 0; node < num_nodes_; ++node) {
    if (node == node_rank_) continue;
    const std::string key = postmortem_key(attempt, node);
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      store().wait({key}, std::max(left, std::chrono::milliseconds(1)));
      parts.push_back(store().get_string(key));
    } catch (const distributed::StoreTimeout&) {
    }
  }
  return parts;
}

std::string NodeLink::finish(bool succeeded, std::chrono::milliseconds timeout) {
  stop_watching();
  if (!succeeded) return {};  // the failure was published; nobody waits for "done"
  try {
    store().add(done_key(node_rank_), 1);
    const int64_t done = store().add(kDoneKey, 1);
    if (node_rank_ != 0 || done >= num_nodes_) return {};
    std::vector<int> others;
    for (int n = 1; n < num_nodes_; ++n) others.push_back(n);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    bool said = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!said && std::chrono::steady_clock::now() - start > std::chrono::seconds(2)) {
        fmt::print(stderr, "lockstep-run: node 0's ranks are done; keeping the store up until "
                   "the other nodes finish\n");
        said = true;
      }
      if (store().add(kDoneKey, 0) >= num_nodes_) return {};
      if (const std::string failure = remote_failure(); !failure.empty()) return failure;
      if (interrupted()) return {};  // main reads the signal and says so
      if (const std::string silent = silent_node(store(), others); !silent.empty()) return silent;
      try {
        // A node failed; its launcher stops its ranks without the store.
        store().wait({failure_key()}, kPollInterval);
        return store().get_string(failure_key());
      } catch (const distributed::StoreTimeout&) {
      }
    }
    return fmt::format("node 0 gave up waiting for the other nodes to finish after {} s",
                       std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  } catch (const std::exception& e) {
    return fmt::format("could not learn whether the other nodes finished: {}", e.what());
  }
}

}  // namespace lockstep::launcher
