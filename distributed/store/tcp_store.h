// TcpStore (client) and TcpStoreServer: the job's Store over TCP.
//
// One server per job, run by rank 0 or by the launcher; every rank holds a
// TcpStore client connected to it. The wire protocol is in protocol.h. A
// client first presents the job's token; the server refuses clients with the
// wrong token. Connecting retries with exponential backoff until the
// connect timeout (also while the server turns connections away as busy),
// then fails with a message naming the address and the last error. After the
// server broke a connection (closed it, reset it, garbled a reply), the next
// call connects again within at most 2 s: a server that is gone fails it
// within seconds, not the whole connect timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "lockstep/distributed/store/store.h"

namespace lockstep::distributed {

struct TcpStoreServerOptions {
  std::string host = "0.0.0.0";  // address to listen on
  uint16_t port = 0;             // 0: the kernel picks a free port (see port())
  // Clients must present exactly this in their AUTH frame. Empty: any client
  // that sends an empty AUTH frame is served (the other limits still apply).
  std::string token;
  // Larger frames are rejected. TcpStore clients learn it on connecting and
  // refuse a larger request themselves (a value over it cannot be set).
  uint32_t max_frame_bytes = 64u << 20;
  // All a connection may send before its AUTH frame is accepted (raised to
  // fit an AUTH frame carrying `token`): a client without the token cannot
  // make the server hold more than this.
  uint32_t max_unauthenticated_bytes = 4096;
  // Connections served at once, in all and from one peer IP address; more are
  // turned away with a "busy" reply. One rank holds one connection (a node's
  // launcher two more), so one node of 512 ranks needs ~520 from its address.
  uint32_t max_connections = 16384;
  uint32_t max_connections_per_address = 2048;
  // Clients expected to connect (the job's ranks); 0: not known. The server
  // holds a descriptor per client, so before listening it raises this
  // process's soft open-file limit to fit them (as far as the hard limit
  // goes), and refuses to start, naming both numbers, where the hard limit
  // is too low: past it, accept() fails and the clients beyond it wait out
  // their connect timeout.
  uint32_t expected_clients = 0;
};

// What the server holds now, and what it turned away since the start.
struct TcpStoreServerStats {
  int64_t connections = 0;      // open now
  int64_t unauthenticated = 0;  // of those, not yet past AUTH
  int64_t buffered_bytes = 0;   // input and output buffers of the open connections
  int64_t refused_connections = 0;  // over max_connections(_per_address)
  int64_t failed_accepts = 0;       // accept() failures, e.g. out of descriptors
  // Keys looked up to register or finish pending waits, since the start: the
  // server's work for them, which grows with the waits' keys, not with the
  // writes times those keys.
  int64_t wait_key_checks = 0;
};

// Serves the store from one background thread running an epoll event loop.
// Malformed input from a client (garbage, a frame over the size limit, a bad
// token, a disconnect mid-frame, more than max_unauthenticated_bytes before
// AUTH) closes that client with a logged error; the server and the other
// clients carry on. A warning that repeats (connections turned away, accept()
// failing for want of descriptors) is logged at most once per 10 s with a
// count of what it held back; out of descriptors, the server retries accept()
// every 100 ms and serves its open connections meanwhile.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();  // stops the loop and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  // Clients that were refused or dropped for bad input, since the start
  // (connections turned away by the caps are counted in stats()).
  int64_t rejected_clients() const;
  // A snapshot from any thread; cheap (atomic loads).
  TcpStoreServerStats stats() const;
  // Deletes every key for which `doomed` holds, on the server's thread (safe
  // from any other), and returns how many it deleted. For the keys of a
  // finished attempt of a restarted job, which no client reads again.
  size_t delete_keys_if(const std::function<bool(const std::string&)>& doomed);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // the server's; required (0 names no server)
  std::string token;
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(60);
  // How long get and wait wait for keys; the other calls wait that long for
  // the server's answer, but at least 2 s, however short it is.
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // How long past a get or wait's timeout the client still waits for the
  // server's answer before it calls the server unreachable (StoreUnreachable:
  // its host down, or its process stopped, with the connection left open).
  std::chrono::milliseconds reply_grace = std::chrono::seconds(10);
  // While connecting takes longer than this, print one line to stderr per
  // interval saying who waits for which store and the last error (a long
  // connect timeout is otherwise silent). Zero: never.
  std::chrono::milliseconds report_waiting_every{0};
  std::string who;  // names this client in that line, e.g. "rank 3 of 8 (from slurm)"
  // Asked between connect attempts, and every 100 ms while one waits (for a
  // server that took the connection but does not answer, say) or a call
  // waits for its answer: a reason to stop waiting at once (a launcher told
  // to stop by a signal), which the StoreTimeout thrown then gives; empty:
  // keep waiting until connect_timeout, or the call's own deadline. Unset:
  // never asked.
  std::function<std::string()> give_up;
};

// 128 random bits from /dev/urandom as hex: a fresh token for a job's store,
// which refuses clients without it. Throws when /dev/urandom cannot be read.
std::string random_token();

// A client connection. Calls from several threads are serialised.
class TcpStore final : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  using Store::set;
  using Store::wait;

  // "host:port" of the server, for messages.
  std::string address() const;
  // This end's IP address on the connection to the server (getsockname): the
  // interface that reaches the server's host, where this rank's other
  // listeners (gloo's) should bind so that peers can reach them too.
  std::string local_address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::distributed
