// NodeLink: what the launchers of a several-node job tell each other, through
// the job's store (keys under "lockstep-run/").
//
//  - The first failure on any node is published; every other node's launcher
//    sees it (a watcher thread turns it into a readable fd for the
//    supervisor) and stops its ranks. Losing the store (node 0's launcher
//    ended) counts as a failure too.
//  - Node 0's launcher makes the job's id; every node's ranks get that one.
//  - Node 0 serves the store, so it keeps it up after its own ranks finish
//    until every node reports done (or a failure, or a timeout).
//  - Every node's launcher but node 0's beats (a counter in the store, a few
//    times a second, from a thread of its own). A node whose launcher stops
//    beating before it reported done (killed, its host down) fails the job:
//    node 0's watcher publishes that, and a node waiting for it to restart or
//    finish stops waiting, naming it.
//  - Under --max-restarts, each attempt has its own failure key; after a
//    failure every node's launcher reports its ranks stopped, and when all
//    have, each starts the next attempt. A launcher told to stop by a signal
//    publishes "stop" instead, and no node restarts.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/distributed/store/tcp_store.h"

namespace lockstep::launcher {

// SIGINT, SIGTERM or SIGHUP when one is pending (the launcher blocks them,
// supervisor.h), else 0: a launcher waiting for another node stops then.
int pending_stop_signal();

class NodeLink {
 public:
  // Connects to the store (retrying until `connect_timeout`, or a pending
  // stop signal), starts beating (nodes other than 0) and watching. Another
  // node is gone once its launcher left its beat unchanged for `silent_after`
  // (--node-timeout), node 0 once its store answered nothing for as long;
  // agree_job() makes that node 0's value on every node.
  NodeLink(distributed::TcpStoreOptions store, int node_rank, int num_nodes,
           std::chrono::milliseconds silent_after);
  ~NodeLink();  // stops the watcher
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  // What every node's ranks get alike, made by node 0's launcher: the job's id
  // (LOCKSTEP_JOB_ID) and the port on node 0 left free for the program's own
  // rank 0 (MASTER_PORT).
  struct Job {
    std::string id;
    int master_port = 0;
  };
  // Node 0 publishes `mine` and returns it; the others return node 0's,
  // waiting for it up to `timeout`. Throws when it does not come (or the
  // store is gone). `shape` ("--nnodes 2 --nproc-per-node 4 --max-restarts 0")
  // must be node 0's too: ranks numbered from another shape would never all
  // meet, nor nodes that restart differently, so a node whose shape differs
  // tells every node to stop and throws UsageError naming both. Before that,
  // a second launcher for a node that already joined (one node started twice)
  // throws UsageError and publishes nothing, so the running job goes on.
  Job agree_job(const Job& mine, const std::string& shape, std::chrono::milliseconds timeout);
  // Readable once another node failed (or the store is gone).
  int failure_fd() const { return event_fd_; }
  // What failed elsewhere, for the message.
  std::string remote_failure() const;
  // Publishes this node's failure, unless another was published first.
  void publish_failure(const std::string& what);
  // Tells every node not to restart (this launcher was signalled). Node 0's
  // store then gets 2 s, not --node-timeout, to answer each later call.
  void publish_stop(const std::string& why);
  // After a failed attempt, with this node's ranks stopped: reports so and
  // waits until every node has (then returns true and watches `attempt + 1`),
  // a node published stop (false), or `timeout` or the silence of a node's
  // launcher (throws naming the nodes that did not report). Throws when the
  // store is gone.
  bool agree_to_restart(int attempt, std::chrono::milliseconds timeout);
  // Whether `key` is one the launchers wrote about attempt `attempt` (its
  // failure, stops, verdict and post-mortem parts). Every launcher is done
  // with them once all have agreed to restart after the attempt that follows.
  static bool is_attempt_key(const std::string& key, int attempt);
  // When this node's ranks all succeeded and a restart is still allowed:
  // reports so and waits for the attempt's verdict. True when every node's
  // ranks succeeded (or `timeout` passed, as finish() gives up waiting);
  // false when a node failed in this attempt (remote_failure() says how).
  bool attempt_succeeded_everywhere(std::chrono::milliseconds timeout);
  // The post-mortem's parts (launcher/postmortem.h), by attempt: a node
  // other than 0 hands node 0 its ranks' part; node 0 collects the parts that
  // arrive within `timeout` (a node whose launcher is gone sends none).
  // Either throws when the store is gone.
  void publish_postmortem(int attempt, const std::string& part);
  std::vector<std::string> collect_postmortems(int attempt, std::chrono::milliseconds timeout);
  // Stops watching. After success, reports this node done and, on node 0,
  // waits for the other nodes (up to `timeout`, or a failure, or SIGINT/
  // SIGTERM, or a node's launcher gone silent) so that their ranks keep their
  // store. Returns why the job did not succeed on every node (a node failed
  // or went silent, `timeout` passed, the store was lost), or "" when every
  // node reported done, this node is not node 0, or a signal ended the wait.
  std::string finish(bool succeeded, std::chrono::milliseconds timeout);

 private:
  // Claims this node's place in the job, throwing UsageError, with nothing
  // published, when another launcher holds it (a node started twice).
  void claim_node(const std::string& mine);
  // Takes node 0's `silent_after`, saying so where this node's differs.
  void adopt_node0_timeout();
  void watch();
  void beat();
  // The first of `nodes` whose launcher has not beaten for silent_after_ and
  // has not reported done, described; "" when none. Read through `store`;
  // called by one thread at a time (the watcher, or the main thread once it
  // stopped the watcher).
  std::string silent_node(distributed::TcpStore& store, const std::vector<int>& nodes);
  void notify(const std::string& what);
  // Why a call to node 0's store failed, for a message: its silence said in
  // the launcher's terms, anything else in the store client's.
  std::string unheard_because(const std::exception& e) const;
  distributed::TcpStore& store();  // throws once the watcher found the store lost
  void stop_watching();
  std::string failure_key() const;

  int node_rank_;
  int num_nodes_;
  std::atomic<std::chrono::milliseconds> silent_after_;  // set by agree_job, read by the watcher
  int attempt_ = 0;
  std::unique_ptr<distributed::TcpStore> store_;    // for this thread
  std::unique_ptr<distributed::TcpStore> watcher_;  // for the watcher thread
  std::unique_ptr<distributed::TcpStore> beater_;   // for the beat thread
  int event_fd_ = -1;
  mutable std::mutex mutex_;
  std::string remote_failure_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> store_lost_{false};  // the watcher's verdict
  std::thread thread_;
  // Each node's last beat count seen, and since when; see silent_node().
  struct Beats {
    int64_t count = 0;
    std::chrono::steady_clock::time_point since{};
  };
  std::vector<Beats> beats_;
  std::atomic<bool> stop_beating_{false};
  std::thread beat_thread_;
};

}  // namespace lockstep::launcher
