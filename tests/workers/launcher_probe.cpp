// launcher_probe: a rank program for the launcher tests. Arguments, in any
// order (R is a rank):
//   print            print this rank's variables on one line
//   show=NAME        add NAME=<value or (unset)> to that line
//   cpus             add cpus=<the CPUs it may run on, comma-separated>
//   sigint           add sigint=<default|ignored|handled>: how SIGINT would
//                    find this process (what it inherited through exec)
//   pid-dir=DIR      write DIR/<rank>.pid; exit=/kill=/kill-parent=/async-failure= first wait
//                    (up to 10 s) until every rank has written one
//   exit=R:CODE      rank R exits with CODE
//   kill=R:SIGNAL    rank R raises SIGNAL (a number)
//   kill-parent=R:SIGNAL  rank R sends SIGNAL to its parent (the launcher)
//   ignore-term      ignore SIGTERM (to test the launcher's SIGKILL)
//   partial          print a last line without its newline
//   store-sum        every rank adds rank+1 to a counter in the job's store,
//                    waits for all, checks the sum is W(W+1)/2; exit 1 if not
//   master-sum       the same through a store of the program's own, as a
//                    program written for torchrun makes it from torchrun's
//                    variables alone: rank 0 serves it on MASTER_PORT, every
//                    rank connects to MASTER_ADDR:MASTER_PORT
//   async-failure=R  rank R reports a timed-out collective from a thread of its
//                    own, as the NCCL watchdog does (collectives/async_error.h,
//                    LOCKSTEP_ASYNC_ERROR_HANDLING); if the process is still
//                    there a second later it prints "rank R: still running"
//   group-sum        every rank joins the default process group
//                    (init_process_group) and all-reduces rank+1; prints
//                    "group-sum rank=R restart=N sum=S ok" (or WRONG, exit 1)
//   join             every rank joins the default process group and issues no
//                    collective (before fail-attempts, allreduces and the rest)
//   fail-attempts=R:K  rank R exits 7 (after group-sum, if asked) while
//                    LOCKSTEP_RESTART_COUNT < K
//   allreduces=N     every rank joins the default process group and runs N
//                    all-reduces of 1000 f32 values (after group-sum, if asked)
//   wait-ms=N        sleep N ms before that
//   print-lines=N    then print N lines of 100 bytes (print-lines=R:N: rank R
//                    only); blocks while nobody reads them
//   spin-ms=N        then use the CPU for N ms (busy, not hung)
//   busy-sleep-ms=N  then sleep N ms inside a runtime::BusyScope (not hung)
//                    (busy-sleep-ms=R:N: rank R only)
//   read-idx=PATH    then read the IDX file PATH (runtime::read_idx) and print
//                    "read-idx rows=N": from a FIFO fed slowly, a rank that waits
//                    for a file's bytes (busy, not hung)
//   stop-self=R      then rank R stops itself with SIGSTOP (hung: no heartbeat)
//   block=R          then rank R blocks for good using no CPU (hung: a deadlock)
//   stop-inside=R    then one more all-reduce, which rank R issues at once and
//                    stops itself inside (SIGSTOP from a thread of its own, 0.3 s
//                    on), and the other ranks issue 1 s later
//   then-allreduce   then every rank runs one more all-reduce of 1000 values
//                    (one that stopped, blocked or failed never gets there)
//   zombie=R         rank R leaves a zombie in its process group, before
//                    exit=: a process of it that ended, whose parent (moved to
//                    a group of its own) does not wait for it until the
//                    launcher is gone (as a container's init that does not reap)
//   sleep            then wait until killed (default: exit 0)
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/async_error.h"
#include "lockstep/collectives/init.h"
#include "lockstep/runtime/tensor.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/runtime/data/idx.h"
#include "lockstep/runtime/liveness.h"
#include "lockstep/distributed/store/tcp_store.h"

namespace {

std::string var(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "(unset)";
}

// "R:X" -> X when R is this rank.
bool for_me(const std::string& spec, int rank, int* value) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos || std::stoi(spec.substr(0, colon)) != rank) return false;
  *value = std::stoi(spec.substr(colon + 1));
  return true;
}

void wait_for_pid_files(const std::string& dir, int world) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int n = 0;
    for (int r = 0; r < world; ++r) n += std::filesystem::exists(fmt::format("{}/{}.pid", dir, r));
    if (n == world) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::shared_ptr<lockstep::collectives::ProcessGroup> default_group() {
  static auto group = lockstep::collectives::init_process_group();
  return group;
}

void allreduces(int n) {
  auto group = default_group();
  lockstep::runtime::Tensor t = lockstep::runtime::Tensor::full({1000}, 1.0);
  for (int i = 0; i < n; ++i) group->allreduce(t)->wait();
}

int group_sum(const lockstep::distributed::RankInfo& info) {
  auto group = default_group();
  lockstep::runtime::Tensor t = lockstep::runtime::Tensor::full({1}, info.rank + 1.0);
  group->allreduce(t)->wait();
  const double sum = t.to_vector<float>()[0];
  const double expected = double(info.world_size) * (info.world_size + 1) / 2;
  fmt::print("group-sum rank={} restart={} sum={} {}\n", info.rank, info.restart_count, sum,
             sum == expected ? "ok" : "WRONG");
  std::fflush(stdout);
  group->barrier()->wait();
  return sum == expected ? 0 : 1;
}

int store_sum(const lockstep::distributed::RankInfo& info, const std::string& host, int port,
              const std::string& token, const char* label) {
  lockstep::distributed::TcpStoreOptions options;
  options.host = host;
  options.port = static_cast<uint16_t>(port);
  options.token = token;
  options.connect_timeout = std::chrono::seconds(30);
  options.timeout = std::chrono::seconds(30);
  lockstep::distributed::TcpStore store(options);
  store.add("probe/sum", info.rank + 1);
  if (store.add("probe/arrived", 1) == info.world_size) store.set("probe/done", "1");
  store.wait({"probe/done"});
  const int64_t sum = store.add("probe/sum", 0);
  const int64_t expected = int64_t{info.world_size} * (info.world_size + 1) / 2;
  fmt::print("{} rank={} sum={} expected={} {}\n", label, info.rank, sum, expected,
             sum == expected ? "ok" : "WRONG");
  std::fflush(stdout);
  // Keep the connection until everyone has read the sum.
  if (store.add("probe/read", 1) == info.world_size) store.set("probe/all-read", "1");
  store.wait({"probe/all-read"});
  return sum == expected ? 0 : 1;
}

// See master-sum above. Rank 0's server stays until every other rank has
// said it is done with it.
int master_sum(const lockstep::distributed::RankInfo& info) {
  const std::string host = var("MASTER_ADDR");
  const int port = std::stoi(var("MASTER_PORT"));
  std::unique_ptr<lockstep::distributed::TcpStoreServer> server;
  if (info.rank == 0) {
    lockstep::distributed::TcpStoreServerOptions options;
    options.port = static_cast<uint16_t>(port);
    options.token = "probe";
    server = std::make_unique<lockstep::distributed::TcpStoreServer>(options);
  }
  const int code = store_sum(info, host, port, "probe", "master-sum");
  lockstep::distributed::TcpStoreOptions options;
  options.host = host;
  options.port = static_cast<uint16_t>(port);
  options.token = "probe";
  lockstep::distributed::TcpStore store(options);
  if (info.rank != 0) {
    store.add("probe/left", 1);
  } else {
    while (store.add("probe/left", 0) < info.world_size - 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return code;
}

// See zombie=R above. Returns once the zombie's parent has left the group.
void leave_zombie() {
  const pid_t launcher = getppid();
  int ready[2];
  if (pipe(ready) != 0) std::abort();
  if (fork() != 0) {
    char byte;
    close(ready[1]);
    if (read(ready[0], &byte, 1) != 1) std::abort();
    close(ready[0]);
    return;
  }
  // The parent: async-signal-safe calls only (the rank has threads).
  if (fork() == 0) _exit(0);  // the zombie, in the rank's group
  setpgid(0, 0);
  const int devnull = open("/dev/null", O_RDWR);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) dup2(devnull, fd);
  const char byte = 1;
  if (write(ready[1], &byte, 1) != 1) _exit(1);
  close_range(3, ~0U, 0);  // no pipe of the launcher's kept open
  while (kill(launcher, 0) == 0) usleep(20'000);
  _exit(0);
}

std::string sigint_disposition() {
  struct sigaction current {};
  sigaction(SIGINT, nullptr, &current);
  if (current.sa_handler == SIG_DFL) return "default";
  if (current.sa_handler == SIG_IGN) return "ignored";
  return "handled";
}

std::string allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "unknown";
  std::string list;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    if (!list.empty()) list += ',';
    list += std::to_string(cpu);
  }
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  const auto info = lockstep::distributed::read_rank_info();
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string pid_dir;
  std::string line = fmt::format("rank={} world={} local={} local_world={} node={} source={}",
                                 info.rank, info.world_size, info.local_rank,
                                 info.local_world_size, info.node_rank, info.source);
  bool print = false, partial = false, sleep = false, sum = false, master = false;
  for (const auto& a : args) {
    if (a == "print") print = true;
    if (a == "partial") partial = true;
    if (a == "sleep") sleep = true;
    if (a == "store-sum") sum = true;
    if (a == "master-sum") master = true;
    if (a == "ignore-term") signal(SIGTERM, SIG_IGN);
    if (a == "cpus") line += " cpus=" + allowed_cpus();
    if (a == "sigint") line += " sigint=" + sigint_disposition();
    if (a.rfind("show=", 0) == 0) line += fmt::format(" {}={}", a.substr(5), var(a.substr(5).c_str()));
    if (a.rfind("pid-dir=", 0) == 0) pid_dir = a.substr(8);
  }
  if (print) fmt::print("{}\n", line);
  if (partial) fmt::print("partial line of rank {}", info.rank);
  std::fflush(stdout);
  if (!pid_dir.empty()) {
    const auto path = fmt::format("{}/{}.pid", pid_dir, info.rank);
    std::ofstream(path + ".tmp") << getpid() << "\n";
    std::filesystem::rename(path + ".tmp", path);
  }
  if (sum) return store_sum(info, info.store_host, info.store_port, info.token, "store-sum");
  if (master) return master_sum(info);
  for (const auto& a : args) {
    // A rank that returns 0 before the others' group can form.
    if (a == fmt::format("leave-early={}", info.rank)) return 0;
  }
  for (const auto& a : args) {
    if (a == "join") default_group();
    if (a == "group-sum" && group_sum(info) != 0) return 1;
  }
  for (const auto& a : args) {
    if (a.rfind("allreduces=", 0) == 0) allreduces(std::stoi(a.substr(11)));
  }
  for (const auto& a : args) {
    if (a.rfind("wait-ms=", 0) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(a.substr(8))));
    if (a.rfind("print-lines=", 0) == 0) {
      const std::string spec = a.substr(12);
      int lines = 0;
      if (spec.find(':') == std::string::npos) lines = std::stoi(spec);
      else for_me(spec, info.rank, &lines);
      const std::string text(99, 'x');
      for (int i = 0; i < lines; ++i) fmt::print("{}\n", text);
      std::fflush(stdout);
    }
    if (a.rfind("spin-ms=", 0) == 0) {
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(std::stoi(a.substr(8)));
      volatile uint64_t x = 0;
      while (std::chrono::steady_clock::now() < until) x = x + 1;
    }
    if (a.rfind("busy-sleep-ms=", 0) == 0) {
      const std::string spec = a.substr(14);
      int ms = 0;
      if (spec.find(':') == std::string::npos) ms = std::stoi(spec);
      else for_me(spec, info.rank, &ms);
      const lockstep::runtime::BusyScope busy;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    if (a.rfind("read-idx=", 0) == 0) {
      const auto array = lockstep::runtime::read_idx(a.substr(9));
      fmt::print("read-idx rows={}\n", array.dims.at(0));
      std::fflush(stdout);
    }
    if (a.rfind("stop-self=", 0) == 0 && std::stoi(a.substr(10)) == info.rank) {
      fmt::print("rank {}: stopping itself with SIGSTOP\n", info.rank);
      std::fflush(stdout);
      raise(SIGSTOP);
    }
    if (a.rfind("stop-inside=", 0) == 0) {
      if (std::stoi(a.substr(12)) == info.rank) {
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          raise(SIGSTOP);
        }).detach();
      } else {
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      allreduces(1);
    }
    if (a.rfind("block=", 0) == 0 && std::stoi(a.substr(6)) == info.rank) {
      fmt::print("rank {}: blocking for good\n", info.rank);
      std::fflush(stdout);
      for (;;) pause();
    }
  }
  for (const auto& a : args) {
    // How many keys the launcher's store holds, as this rank of this attempt sees it.
    if (a == fmt::format("store-keys={}", info.rank)) {
      lockstep::distributed::TcpStore store({.host = info.store_host,
                                             .port = static_cast<uint16_t>(info.store_port),
                                             .token = info.token});
      fmt::print("store-keys restart={} keys={}\n", info.restart_count, store.num_keys());
      std::fflush(stdout);
    }
  }
  for (const auto& a : args) {
    int attempts = 0;
    if (a.rfind("fail-attempts=", 0) == 0 && for_me(a.substr(14), info.rank, &attempts) &&
        info.restart_count < attempts) {
      fmt::print("rank {}: failing attempt {}\n", info.rank, info.restart_count);
      std::fflush(stdout);
      return 7;
    }
  }
  for (const auto& a : args) {
    if (a == "then-allreduce") allreduces(1);
  }

  for (const auto& a : args) {
    if (a != fmt::format("async-failure={}", info.rank)) continue;
    if (!pid_dir.empty()) wait_for_pid_files(pid_dir, info.world_size);
    const auto handling = lockstep::collectives::async_error_handling_from_env();
    std::thread watchdog([&] {
      lockstep::collectives::on_async_failure(
          handling, {fmt::format("rank {} of group 'probe' (nccl, {} ranks)", info.rank,
                                 info.world_size),
                     "allreduce #3 (f32, 1024 elements, sum) timed out after 0.3 s"});
    });
    watchdog.join();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    fmt::print("rank {}: still running\n", info.rank);
    std::fflush(stdout);
  }

  for (const auto& a : args) {
    if (a == fmt::format("zombie={}", info.rank)) leave_zombie();
  }
  for (const auto& a : args) {
    int value = 0;
    const auto eq = a.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = a.substr(0, eq);
    if (key != "exit" && key != "kill" && key != "kill-parent") continue;
    if (!for_me(a.substr(eq + 1), info.rank, &value)) continue;
    if (!pid_dir.empty()) wait_for_pid_files(pid_dir, info.world_size);
    if (key == "exit") return value;
    if (key == "kill") raise(value);
    if (key == "kill-parent") kill(getppid(), value);
  }
  if (sleep) {
    for (;;) pause();
  }
  return 0;
}
