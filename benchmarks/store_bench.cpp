// The store's rendezvous at scale: N clients, each waiting for every
// client's key (as every rank waits for every rank's placement in
// init_process_group), then each key set once.
//
//   build/bin/store_bench [--clients 64,256,512] [--iters 3] [--json FILE]
//
// For each N: the seconds from the first key set until every wait has
// returned (median of --iters), and the keys the server looked up for the
// waits (TcpStoreServer::stats().wait_key_checks, per run): 2 N^2 when each
// write costs only its waiters, about N^3 / 2 when each write rescans every
// key of every wait on it. Server and clients run in this process, on
// loopback; each client is a connection of its own on a thread of its own.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli_checks.h"
#include "common/writable_file.h"
#include "harness.h"
#include "lockstep/distributed/store/tcp_store.h"

using namespace lockstep;
using nlohmann::json;

namespace {

constexpr const char* kToken = "store-bench";

struct Options {
  std::vector<int> clients = {64, 256, 512};
  int iters = 3;
  std::string json_file;
};

// Every client a descriptor, and the server one per client: lift the soft
// limit to the hard one, and say so when even that is too few.
void allow_descriptors(int clients) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
  const rlim_t needed = static_cast<rlim_t>(2 * clients + 64);
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < needed)
    throw std::runtime_error(fmt::format("{} clients need about {} open files; this process may "
                                         "open {} (ulimit -n)",
                                         clients, needed, r.rlim_cur));
}

distributed::TcpStoreOptions client_options(uint16_t port) {
  distributed::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = kToken;
  o.timeout = std::chrono::minutes(10);
  return o;
}

struct Run {
  double seconds = 0;
  int64_t wait_key_checks = 0;
};

// One rendezvous of n clients on a fresh server.
Run rendezvous(int n) {
  distributed::TcpStoreServer server({.host = "127.0.0.1", .port = 0, .token = kToken});
  std::vector<std::unique_ptr<distributed::TcpStore>> clients;
  for (int i = 0; i < n; ++i)
    clients.push_back(std::make_unique<distributed::TcpStore>(client_options(server.port())));
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(fmt::format("bench/placement/{}", i));
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ++started;
      clients[static_cast<size_t>(i)]->wait(keys);
    });
  }
  while (started < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Every wait registered with the server before the first key: a wait
  // sent after its keys is answered at once and measures nothing.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  distributed::TcpStore writer(client_options(server.port()));
  const auto start = std::chrono::steady_clock::now();
  for (const auto& key : keys) writer.set(key, {1});
  for (auto& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds, server.stats().wait_key_checks};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"The store's rendezvous: N clients each waiting for all N keys."};
  app.add_option("--clients", o.clients, "numbers of clients, comma-separated")
      ->delimiter(',')
      ->check(cli_checks::positive);
  app.add_option("--iters", o.iters, "timed runs per number (median reported)")
      ->check(cli_checks::positive);
  app.add_option("--json", o.json_file, "also write the results as JSON to this file")
      ->check(bench::writable_file);
  CLI11_PARSE(app, argc, argv);

  try {
    allow_descriptors(*std::max_element(o.clients.begin(), o.clients.end()));
    json results = json::array();
    std::vector<std::vector<std::string>> rows;
    for (int n : o.clients) {
      std::vector<double> seconds;
      int64_t checks = 0;
      for (int i = 0; i < o.iters; ++i) {
        const Run run = rendezvous(n);
        seconds.push_back(run.seconds);
        checks = run.wait_key_checks;
      }
      const double median = bench::median(seconds);
      const double per_wait = static_cast<double>(checks) / n;
      results.push_back({{"clients", n},
                         {"seconds", median},
                         {"wait_key_checks", checks},
                         {"key_checks_per_wait", per_wait}});
      rows.push_back({std::to_string(n), fmt::format("{:.3f}", median), std::to_string(checks),
                      fmt::format("{:.1f}", per_wait / n)});
    }
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    fmt::print("store_bench {} on {}\nmedian of {} runs; key checks per wait in units of N "
               "(2.0: each wait's keys looked at twice)\n",
               date, bench::machine_description(), o.iters);
    fmt::print("{}", bench::format_table({"clients N", "all waits answered s", "key checks",
                                          "per wait / N"},
                                         rows));
    if (!o.json_file.empty()) {
      bench::write_json_file({{"benchmark", "store_bench"},
                              {"date", date},
                              {"machine", bench::machine_description()},
                              {"iters", o.iters},
                              {"results", results}},
                             o.json_file);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "store_bench: error: {}\n", e.what());
    return 1;
  }
}
