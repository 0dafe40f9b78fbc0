// MemoryStore: every command, blocking get/wait across threads, timeouts.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "lockstep/distributed/store/memory_store.h"
#include "support/test_util.h"

using namespace lockstep::distributed;
using lockstep::testing::error_of;
using namespace std::chrono_literals;

TEST_CASE("memory store: set, get, delete_key and num_keys", "[store]") {
  MemoryStore store;
  CHECK(store.num_keys() == 0);
  store.set("a", "1");
  store.set("b", Bytes{0, 255, 7});
  CHECK(store.get_string("a") == "1");
  CHECK(store.get("b") == Bytes{0, 255, 7});
  store.set("a", "replaced");
  CHECK(store.get_string("a") == "replaced");
  CHECK(store.num_keys() == 2);
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK(store.num_keys() == 1);
  // A "forever" timeout must not overflow the clock.
  store.wait({"b"}, std::chrono::milliseconds::max());
}

TEST_CASE("memory store: add counts from zero and refuses non-counters", "[store]") {
  MemoryStore store;
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get_string("n") == "-2");
  store.set("text", "hello");
  CHECK_THAT(error_of([&] { store.add("text", 1); }),
             Catch::Contains("'text'") && Catch::Contains("not the decimal text"));
}

TEST_CASE("memory store: compare_set swaps only on a match", "[store]") {
  MemoryStore store;
  // Missing key matches an empty expected value.
  CHECK(to_string(store.compare_set("k", {}, to_bytes("v1"))) == "v1");
  CHECK(to_string(store.compare_set("k", to_bytes("wrong"), to_bytes("v2"))) == "v1");
  CHECK(to_string(store.compare_set("k", to_bytes("v1"), to_bytes("v2"))) == "v2");
  CHECK(store.get_string("k") == "v2");
  // Missing key with a non-empty expected value: nothing set.
  CHECK(store.compare_set("absent", to_bytes("x"), to_bytes("y")).empty());
  CHECK(store.num_keys() == 1);
}

TEST_CASE("memory store: get blocks until another thread sets the key", "[store]") {
  MemoryStore store;
  std::atomic<bool> set_done{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    set_done = true;
    store.set("late", "here");
  });
  CHECK(store.get_string("late") == "here");
  CHECK(set_done);
  setter.join();
}

TEST_CASE("memory store: wait on several keys, and timeouts name the missing keys", "[store]") {
  MemoryStore store;
  std::thread setter([&] {
    store.set("x", "1");
    std::this_thread::sleep_for(20ms);
    store.add("y", 1);
  });
  store.wait({"x", "y"}, 30s);
  setter.join();
  CHECK(store.num_keys() == 2);

  const auto message = error_of([&] { store.wait({"x", "nope"}, 50ms); });
  CHECK_THAT(message, Catch::Contains("timed out") && Catch::Contains("missing: 'nope'"));
  CHECK_THROWS_AS(store.wait({"nope"}, 10ms), StoreTimeout);
  store.set_timeout(20ms);
  CHECK_THROWS_AS(store.get("nope"), StoreTimeout);
}

TEST_CASE("memory store: adds from many threads sum exactly", "[store]") {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) store.add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(store.add("counter", 0) == 8000);
}
