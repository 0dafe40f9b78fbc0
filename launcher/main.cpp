// lockstep-run: starts the ranks of this node and supervises them (see
// README.md). Node 0 serves the job's store for the lifetime of the job.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "launcher/child_env.h"
#include "launcher/cpu_binding.h"
#include "launcher/descriptor_limit.h"
#include "launcher/flight_record_dir.h"
#include "launcher/group_reaper.h"
#include "launcher/node_link.h"
#include "launcher/options.h"
#include "launcher/output_queue.h"
#include "launcher/postmortem.h"
#include "launcher/program_port.h"
#include "launcher/spawn.h"
#include "launcher/supervisor.h"
#include "lockstep/distributed/exit_status.h"
#include "lockstep/distributed/exited_ranks.h"
#include "lockstep/distributed/store/listen_address.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "lockstep/runtime/standard_streams.h"

extern char** environ;

namespace lockstep::launcher {
namespace {

// Seconds before restart `done + 1`: the backoff, doubled for each restart
// before it, at most 60 s.
double restart_delay_s(double backoff_s, int done) {
  return std::min(60.0, backoff_s * std::pow(2.0, std::min(done, 30)));
}

// "3 ranks", or with several nodes "2 ranks of node 1": what this launcher starts.
std::string ranks_here(const Options& options) {
  const std::string ranks = options.nproc_per_node == 1
                                ? std::string("rank")
                                : fmt::format("{} ranks", options.nproc_per_node);
  return options.nnodes == 1 ? ranks : fmt::format("{} of node {}", ranks, options.node_rank);
}

// Several nodes: each node's part of the post-mortem goes to node 0, whose
// report covers every node that answered within the others' grace period
// (their ranks stop first). True when this node should print a report: node
// 0, or another whose part could not be handed over.
bool share_postmortem(NodeLink& link, Postmortem& postmortem, int attempt, const Options& options,
                      std::chrono::milliseconds grace_period) {
  try {
    if (options.node_rank != 0) {
      link.publish_postmortem(attempt, distributed::to_json_text(postmortem));
      return false;
    }
    for (const auto& part : link.collect_postmortems(attempt, grace_period + std::chrono::seconds(3)))
      distributed::merge(postmortem, distributed::postmortem_from_json_text(part));
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: the post-mortem covers node {} only: {}\n",
               options.node_rank, e.what());
  }
  // A node that sent no part has its ranks named as such: without them the
  // report would speak of "every rank" for the nodes that answered.
  const int world_size = options.nnodes * options.nproc_per_node;
  for (int rank = 0; rank < world_size; ++rank) {
    const int node = rank / options.nproc_per_node;
    RankHistory missing{.rank = rank,
                        .node = node,
                        .no_record = fmt::format("node {} sent no part of the post-mortem", node)};
    distributed::merge(postmortem, Postmortem{.ranks = {std::move(missing)}});
  }
  return true;
}

// Tells the other nodes that this node's launcher was told to stop (`why`)
// while its ranks were not running: their ranks stop and no node restarts.
// Node 0 collects the post-mortem of `attempt`: another node hands it `part`,
// what its ranks left, or node 0 would wait the grace period plus 3 s for it.
void tell_stopped(NodeLink& link, const Options& options, int attempt, const std::string& why,
                  const Postmortem& part) {
  link.publish_stop(why);
  link.publish_failure(why);
  if (options.node_rank == 0) return;  // node 0 collects the parts
  try {
    link.publish_postmortem(attempt, distributed::to_json_text(part));
  } catch (const std::exception&) {  // node 0 then waits for it in vain, as before
  }
}

// A node told to stop while waiting to start `next_attempt`: the other nodes
// agreed to restart too, so their next ranks must not wait for this node's.
void stopped_before_restart(NodeLink& link, const Options& options, int next_attempt,
                            const std::string& signal) {
  const std::string why = fmt::format("node {}'s launcher received {} while waiting to restart",
                                      options.node_rank, signal);
  Postmortem none{.cause = why};
  for (int local = 0; local < options.nproc_per_node; ++local) {
    none.ranks.push_back({.rank = rank_slot(options, local).rank,
                          .node = options.node_rank,
                          .no_record = fmt::format("not started: node {}'s launcher was stopped "
                                                   "before the restart",
                                                   options.node_rank)});
  }
  tell_stopped(link, options, next_attempt, why, none);
}

// Node 0's own ranks connect to the store at --master-addr as every rank
// does: an address that does not lead back to this host (another machine's,
// a typo) would leave them retrying until the hang detector or the store's
// timeout ended them, blamed on a deadlock. Said now, before a rank starts.
void check_store_reachable(const StoreAddress& address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  std::string why = "it does not resolve";
  if (::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found) == 0) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                              a->ai_protocol);
      if (fd < 0) continue;
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      int error = rc == 0 ? 0 : errno;
      if (rc != 0 && errno == EINPROGRESS) {
        // This host answers at once; 3 s leaves room for a NAT that loops back.
        pollfd p{fd, POLLOUT, 0};
        while ((rc = ::poll(&p, 1, 3000)) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof error;
        if (rc == 0) error = ETIMEDOUT;
        else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      }
      ::close(fd);
      if (error == 0) {
        ::freeaddrinfo(found);
        return;
      }
      why = std::strerror(error);
    }
    ::freeaddrinfo(found);
  }
  throw UsageError(fmt::format(
      "--master-addr {}: this node serves the job's store, but its ranks could not connect to "
      "it at {}:{} ({}); give an address of this host (on one node, leave --master-addr out)",
      address.host, address.host, address.port, why));
}

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

int run(const Options& options) {
  const auto& env = runtime::process_env();
  const auto program =
      find_program(options.command[0], env("PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
  if (!program) {
    throw UsageError(
        fmt::format("program '{}' {}", options.command[0], why_not_found(options.command[0])));
  }
  if (const auto why = why_interpreter_fails(*program))
    throw UsageError(fmt::format("program '{}' {}", options.command[0], *why));

  ensure_descriptor_limit(options);
  // Before the store server's thread starts: the reaper is a fork of this process.
  GroupReaper reaper = GroupReaper::start();

  StoreAddress address;
  address.host = options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  address.port = options.master_port;
  address.token = options.token.empty() ? distributed::random_token() : options.token;

  std::unique_ptr<distributed::TcpStoreServer> server;
  if (options.node_rank == 0) {
    distributed::TcpStoreServerOptions server_options;
    // Reachable only where the ranks look for it.
    server_options.host = distributed::listen_host_for(address.host, options.nnodes == 1);
    server_options.port = static_cast<uint16_t>(options.master_port);
    server_options.token = address.token;
    server = std::make_unique<distributed::TcpStoreServer>(server_options);
    address.port = server->port();
    if (!options.master_addr.empty()) check_store_reachable(address);
  }

  // One id for this launch, every attempt and node alike: a restarted
  // program continues the run this job started and no other
  // (train/training_run.h).
  NodeLink::Job job{.id = distributed::random_token().substr(0, 16)};
  if (options.node_rank == 0)
    job.master_port = options.program_port == 0
                          ? free_program_port(address.host)
                          : chosen_program_port(address.host, options.program_port);
  std::unique_ptr<NodeLink> link;
  if (options.nnodes > 1) {
    distributed::TcpStoreOptions client;
    client.host = address.host;
    client.port = static_cast<uint16_t>(address.port);
    client.token = address.token;
    try {
      link = std::make_unique<NodeLink>(
          client, options.node_rank, options.nnodes,
          std::chrono::milliseconds(static_cast<int64_t>(options.node_timeout_s * 1000.0)));
      // Restarts too: a node that restarts alone waits for the others in vain.
      // And the program's port: a node's ranks would look for their rank 0
      // at node 0's, not at the one its own -x MASTER_PORT chose.
      job = link->agree_job(
          job,
          fmt::format("--nnodes {} --nproc-per-node {} --max-restarts {}{}", options.nnodes,
                      options.nproc_per_node, options.max_restarts,
                      options.program_port == 0
                          ? std::string()
                          : fmt::format(" -x MASTER_PORT={}", options.program_port)),
          std::chrono::minutes(5));
    } catch (const UsageError&) {
      throw;
    } catch (const Error&) {
      // Ctrl-C while waiting for node 0's launcher ends the wait, as signalled.
      const int sig = pending_stop_signal();
      if (sig == 0) throw;
      fmt::print(stderr, "lockstep-run: received {} while waiting for node 0's launcher at "
                 "{}:{}; no rank was started\n",
                 distributed::signal_name(sig), address.host, address.port);
      return 128 + sig;
    }
  }

  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) base.emplace_back(*e);

  std::vector<std::vector<int>> cpus(static_cast<size_t>(options.nproc_per_node));
  if (options.bind_to_core) {
    const auto cores = allowed_cores();
    const auto shares = share_cores(cores, options.nproc_per_node);
    if (shares.empty()) {
      size_t n = 0;
      for (const auto& core : cores) n += core.size();
      fmt::print(stderr, "lockstep-run: --bind-to core: {} ranks on this node but {} CPU{}; "
                 "the ranks are not bound\n", options.nproc_per_node, n, n == 1 ? "" : "s");
    } else {
      cpus = shares;
    }
  }

  SupervisorOptions supervisor;
  supervisor.grace_period = std::chrono::milliseconds(
      static_cast<int64_t>(options.grace_period_s * 1000.0));
  supervisor.hang_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(options.hang_timeout_s * 1000.0));
  supervisor.node_rank = options.node_rank;
  supervisor.hostname = hostname();
  if (link) {
    supervisor.remote_failure_fd = link->failure_fd();
    supervisor.remote_failure = [&] { return link->remote_failure(); };
    supervisor.on_local_failure = [&](const std::string& what) { link->publish_failure(what); };
    supervisor.on_signalled = [&](const std::string& why) { link->publish_stop(why); };
  }

  // A rank that exits 0 while others run may leave them waiting for it to
  // join their group: written down where they look (distributed/exited_ranks.h).
  distributed::ExitRecorder exits({.host = address.host,
                                   .port = static_cast<uint16_t>(address.port),
                                   .token = address.token});

  const FlightRecorderFiles recorders;
  if (recorders.dir().empty())
    fmt::print(stderr, "lockstep-run: warning: the ranks' flight records are off for this job "
               "(a failure's report will not list their last collectives): {}; set TMPDIR to a "
               "writable directory to have them\n", recorders.unavailable());
  else
    reaper.remove_at_exit(recorders.dir());
  const Capture capture = !options.tag_output ? Capture::none
                          : same_file(STDOUT_FILENO, STDERR_FILENO) ? Capture::merged
                                                                    : Capture::separate;
  int code = 0;
  int attempt = 0;  // the last one started, once the loop ends
  std::vector<RankProcess> started;  // its ranks
  // What the ranks of the attempt recorded of their last collectives, as
  // their flight records say now.
  const auto read_postmortem = [&](const std::string& cause) {
    Postmortem pm{.cause = cause};
    for (const auto& r : started) {
      pm.ranks.push_back(read_rank_history(recorders.path(r.rank), r.rank, options.node_rank,
                                           supervisor.hostname, r.child.pid));
    }
    return pm;
  };
  for (;; ++attempt) {
    recorders.clear();
    std::vector<RankProcess> ranks;
    for (int local = 0; local < options.nproc_per_node; ++local) {
      const RankSlot slot = rank_slot(options, local);
      const auto child_env =
          child_environment(base, options, slot, address, job.master_port, attempt,
                            recorders.path(slot.rank), job.id);
      ranks.push_back({slot.rank, local,
                       spawn_child(*program, options.command, child_env, capture,
                                   cpus[static_cast<size_t>(local)],
                                   /*heartbeat=*/options.hang_timeout_s > 0)});
      reaper.watch(ranks.back().child.pid);
    }
    // Read while the ranks are as the failure found them; told once they stopped.
    started = ranks;
    std::optional<Postmortem> postmortem;
    supervisor.before_stop = [&](const std::string& cause) { postmortem = read_postmortem(cause); };
    supervisor.on_rank_exited = [&exits, attempt](int rank, const std::string& how) {
      exits.record(attempt, {.rank = rank, .how = how});
    };
    const SupervisorResult result = supervise(std::move(ranks), supervisor);
    code = result.exit_code;
    // Signalled once every rank here had ended (only its output kept it):
    // nothing here was stopped, but the other nodes' ranks were, and their
    // post-mortem covers these ranks too.
    if (!postmortem && link && result.outcome == Outcome::signalled)
      postmortem = read_postmortem(result.failure);
    if (postmortem &&
        (!link || share_postmortem(*link, *postmortem, attempt, options, supervisor.grace_period)))
      publish_report(*postmortem, options.postmortem_dir, job.id, options.node_rank, attempt);
    // Only a rank's failure, here or on another node, is worth another
    // attempt: a stop asked for by a signal is the user's.
    bool failed =
        result.outcome == Outcome::rank_failed || result.outcome == Outcome::remote_failed;
    // An attempt succeeds when every node's ranks do: this node's finished,
    // another's may still fail, and then this node's start again too.
    if (result.outcome == Outcome::succeeded && link && attempt < options.max_restarts) {
      try {
        if (!link->attempt_succeeded_everywhere(std::chrono::minutes(5))) {
          fmt::print(stderr, "lockstep-run: {}; node {}'s ranks had finished\n",
                     link->remote_failure(), options.node_rank);
          failed = true;
          code = 1;
        }
      } catch (const std::exception& e) {
        fmt::print(stderr, "lockstep-run: could not learn whether the other nodes finished: {}\n",
                   e.what());
        code = 1;
        break;
      }
    }
    if (!failed || options.max_restarts == 0) break;
    if (result.stop_signal != 0) {
      fmt::print(stderr, "lockstep-run: received {} while the ranks stopped; not restarting\n",
                 distributed::signal_name(result.stop_signal));
      break;
    }
    if (attempt == options.max_restarts) {
      fmt::print(stderr, "lockstep-run: giving up: the ranks failed {} times, and "
                 "--max-restarts {} allows no further restart\n",
                 attempt + 1, options.max_restarts);
      break;
    }
    // Every node's ranks are stopped before any node starts its next ones.
    if (link) {
      try {
        if (!link->agree_to_restart(attempt, supervisor.grace_period + std::chrono::seconds(60))) {
          // Told to stop while the nodes agreed: no node restarts.
          if (const int sig = wait_unless_signalled(std::chrono::milliseconds(1)); sig != 0) {
            const std::string why = fmt::format("node {}'s launcher received {}",
                                                options.node_rank, distributed::signal_name(sig));
            fmt::print(stderr, "lockstep-run: {} while the nodes agreed to restart; not "
                       "restarting\n", why);
            link->publish_stop(why);
          }
          break;
        }
      } catch (const std::exception& e) {
        fmt::print(stderr, "lockstep-run: cannot restart: {}\n", e.what());
        break;
      }
    }
    // Every rank of this attempt has stopped: no one reads its keys again,
    // and a job restarted many times would otherwise keep every attempt's.
    // The launchers' own keys of the attempt before: every launcher left
    // their waits when it agreed on this restart, those of this one they
    // may still be reading.
    if (server)
      server->delete_keys_if([attempt](const std::string& key) {
        return distributed::is_attempt_key(key, attempt) ||
               (attempt > 0 && NodeLink::is_attempt_key(key, attempt - 1));
      });
    const double delay_s = restart_delay_s(options.restart_backoff_s, attempt);
    fmt::print(stderr, "lockstep-run: restart {} of {}: starting the {} again in {:g} s, with "
               "LOCKSTEP_RESTART_COUNT={}\n",
               attempt + 1, options.max_restarts, ranks_here(options), delay_s, attempt + 1);
    if (const int sig = wait_unless_signalled(std::chrono::milliseconds(
            static_cast<int64_t>(delay_s * 1000.0)));
        sig != 0) {
      fmt::print(stderr, "lockstep-run: received {} while waiting to restart; not restarting\n",
                 distributed::signal_name(sig));
      code = 128 + sig;
      if (link) stopped_before_restart(*link, options, attempt + 1, distributed::signal_name(sig));
      break;
    }
  }
  if (link) {
    const std::string elsewhere = link->finish(code == 0, std::chrono::minutes(5));
    // A signal that ended node 0's wait for the other nodes ends the job: the
    // other nodes are told, and this launcher exits as signalled (it exited
    // 0 and the others learnt only that the store was gone).
    if (const int sig = code == 0 ? wait_unless_signalled(std::chrono::milliseconds(1)) : 0;
        sig != 0) {
      const std::string why =
          fmt::format("node {}'s launcher received {} while waiting for the other nodes",
                      options.node_rank, distributed::signal_name(sig));
      fmt::print(stderr, "lockstep-run: {}; stopping the job\n", why);
      // A stop, not a failure: under --max-restarts the others would wait
      // for this node to restart with them.
      tell_stopped(*link, options, attempt, why, read_postmortem(why));
      code = 128 + sig;
    } else if (!elsewhere.empty()) {
      // This node's ranks succeeded, but the job did not on every node.
      fmt::print(stderr, "lockstep-run: {}; node {}'s ranks had finished\n", elsewhere,
                 options.node_rank);
      code = 1;
    }
  }
  reaper.disarm();  // every rank was stopped and reaped
  return code;
}

// --postmortem-from: the report of a job that another launcher ran.
int report_from(const std::string& dir) {
  const Postmortem pm = read_rank_postmortems(dir);
  const std::string text = report_text(
      pm, fmt::format("it wrote no part to {}: it was stopped or killed, exited first, or "
                      "does not see the directory",
                      dir));
  if (text.empty()) {
    fmt::print(stderr, "lockstep-run: the parts in {} record no collective\n", dir);
    return 1;
  }
  fmt::print(stderr, "lockstep-run: post-mortem of the collectives ({}):\n{}", pm.cause, text);
  return 0;
}

}  // namespace
}  // namespace lockstep::launcher

int main(int argc, char** argv) {
  using namespace lockstep::launcher;
  lockstep::runtime::open_closed_standard_streams();
  // Before any thread starts (the store server's), so all inherit the mask.
  block_supervisor_signals();
  try {
    const auto parsed = parse_command_line(argc, argv, lockstep::runtime::process_env());
    if (!parsed.help.empty()) {
      fmt::print("{}", parsed.help);
      return 0;
    }
    const Options& options = parsed.options;
    if (!options.postmortem_from.empty()) return report_from(options.postmortem_from);
    return run(options);
  } catch (const UsageError& e) {
    fmt::print(stderr, "lockstep-run: {}\nRun 'lockstep-run --help' for usage.\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: {}\n", e.what());
    return 1;
  }
}
