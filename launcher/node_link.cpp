#include "launcher/node_link.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace lockstep::launcher {
namespace {

const std::string kFailureKey = "lockstep-run/failure";
const std::string kDoneKey = "lockstep-run/nodes-done";
constexpr auto kPollInterval = std::chrono::milliseconds(200);

// The launcher blocks these (supervisor.h); one pending means: stop waiting.
bool interrupted() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM) ||
         sigismember(&pending, SIGHUP);
}

}  // namespace

NodeLink::NodeLink(const runtime::TcpStoreOptions& store, int node_rank, int num_nodes)
    : node_rank_(node_rank), num_nodes_(num_nodes) {
  store_ = std::make_unique<runtime::TcpStore>(store);
  watcher_ = std::make_unique<runtime::TcpStore>(store);
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  LOCKSTEP_CHECK(event_fd_ >= 0, "eventfd failed: {}", std::strerror(errno));
  thread_ = std::thread([this] { watch(); });
}

NodeLink::~NodeLink() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  close(event_fd_);
}

void NodeLink::watch() {
  while (!stop_) {
    try {
      watcher_->wait({kFailureKey}, kPollInterval);
      notify(watcher_->get_string(kFailureKey));
      return;
    } catch (const runtime::StoreTimeout&) {
      // Nothing yet; look again unless asked to stop.
    } catch (const std::exception& e) {
      if (!stop_) notify(fmt::format("lost the job's store (node 0's launcher ended?): {}", e.what()));
      return;
    }
  }
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

std::string NodeLink::remote_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remote_failure_;
}

void NodeLink::publish_failure(const std::string& what) {
  try {
    store_->compare_set(kFailureKey, {}, runtime::to_bytes(fmt::format("node {}: {}", node_rank_, what)));
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: could not tell the other nodes: {}\n", e.what());
  }
}

void NodeLink::finish(bool succeeded, std::chrono::milliseconds timeout) {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (!succeeded) return;  // the failure was published; nobody waits for "done"
  try {
    const int64_t done = store_->add(kDoneKey, 1);
    if (node_rank_ != 0 || done >= num_nodes_) return;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    bool said = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!said && std::chrono::steady_clock::now() - start > std::chrono::seconds(2)) {
        fmt::print(stderr, "lockstep-run: node 0's ranks are done; keeping the store up until "
                   "the other nodes finish\n");
        said = true;
      }
      if (store_->add(kDoneKey, 0) >= num_nodes_) return;
      if (!remote_failure().empty() || interrupted()) return;
      try {
        store_->wait({kFailureKey}, kPollInterval);
        return;  // a node failed; its launcher stops its ranks without the store
      } catch (const runtime::StoreTimeout&) {
      }
    }
    fmt::print(stderr, "lockstep-run: gave up waiting for the other nodes after {} s\n",
               std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: could not report this node done: {}\n", e.what());
  }
}

}  // namespace lockstep::launcher
