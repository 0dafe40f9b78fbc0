// In-process multi-rank tests: one thread per rank over a shared MemoryStore.
//
// Catch2's assertions are not thread-safe, so rank threads record problems as
// strings and the test checks them on the main thread.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/collectives/init.h"
#include "lockstep/distributed/store/memory_store.h"

namespace lockstep::testing {

// Runs fn(rank) on `size` threads; returns each rank's exception (or null).
inline std::vector<std::exception_ptr> run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string message_of(const std::exception_ptr& error) {
  if (!error) return "<no exception>";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<unknown exception>";
}

// One group per rank of `backend`, made concurrently (the rendezvous needs
// every rank) over one fresh MemoryStore.
inline std::vector<std::shared_ptr<collectives::ProcessGroup>> make_groups(
    const std::string& backend, int size, const std::string& name,
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    distributed::DebugLevel debug = distributed::DebugLevel::Off) {
  auto store = std::make_shared<distributed::MemoryStore>();
  std::vector<std::shared_ptr<collectives::ProcessGroup>> groups(static_cast<size_t>(size));
  const auto errors = run_ranks(size, [&](int r) {
    groups[static_cast<size_t>(r)] =
        collectives::make_process_group(backend, store, r, size, name, timeout, debug);
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return groups;
}

// This thread alone as a group (rank 0 of 1), made once per process, for the
// calls that take a group in a one-process test (one_rank_group_ptr(): for
// objects that keep it). Never destroyed: it stays reachable, and no test's
// end waits on its shutdown.
inline std::shared_ptr<collectives::ProcessGroup> one_rank_group_ptr() {
  static auto* group = new std::shared_ptr<collectives::ProcessGroup>(make_groups("shm", 1, "alone")[0]);
  return *group;
}
inline collectives::ProcessGroup& one_rank_group() { return *one_rank_group_ptr(); }

}  // namespace lockstep::testing
