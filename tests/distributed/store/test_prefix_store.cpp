// PrefixStore: keys are namespaced under "<prefix>/", every command forwards.
#include <catch2/catch.hpp>

#include <memory>

#include "lockstep/distributed/store/memory_store.h"
#include "lockstep/distributed/store/prefix_store.h"
#include "support/test_util.h"

using namespace lockstep::distributed;
using namespace std::chrono_literals;

TEST_CASE("prefix store: keys live under the prefix in the inner store", "[store]") {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore a("group_a", inner);
  PrefixStore b("group_b", inner);
  a.set("k", "from a");
  b.set("k", "from b");
  CHECK(a.get_string("k") == "from a");
  CHECK(b.get_string("k") == "from b");
  CHECK(inner->get_string("group_a/k") == "from a");
  CHECK(a.prefix() == "group_a");
  CHECK(a.inner() == inner);
  // num_keys counts the whole inner store.
  CHECK(a.num_keys() == 2);
}

TEST_CASE("prefix store: add, compare_set, wait and delete_key forward", "[store]") {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("p", inner);
  CHECK(store.add("n", 3) == 3);
  CHECK(inner->add("p/n", 1) == 4);
  CHECK(to_string(store.compare_set("c", {}, to_bytes("v"))) == "v");
  CHECK(inner->get_string("p/c") == "v");
  store.wait({"n", "c"}, 1s);
  CHECK_THROWS_AS(store.wait({"n", "missing"}, 10ms), StoreTimeout);
  CHECK(store.delete_key("n"));
  CHECK_FALSE(inner->delete_key("p/n"));
  CHECK_FALSE(store.delete_key("n"));
}

TEST_CASE("prefix store: get honours the view's timeout and names the full key", "[store]") {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("p", inner);
  store.set_timeout(20ms);
  const auto message = lockstep::testing::error_of([&] { store.get("absent"); });
  CHECK_THAT(message, Catch::Contains("'p/absent'"));
  CHECK_THROWS_AS(PrefixStore("x", nullptr), lockstep::Error);
}
