// listen_host_for(): a store listens where its clients look for it.
#include <catch2/catch.hpp>

#include <string>

#include "lockstep/distributed/store/listen_address.h"
#include "lockstep/distributed/store/tcp_store.h"

using lockstep::distributed::first_interface_ipv4;
using lockstep::distributed::listen_host_for;
using lockstep::distributed::names_loopback;

TEST_CASE("listen address: loopback only while every client is on this host", "[store]") {
  CHECK(listen_host_for("127.0.0.1", true) == "127.0.0.1");
  CHECK(listen_host_for("127.0.1.1", true) == "127.0.1.1");
  const std::string local = listen_host_for("localhost", true);
  CHECK((local.starts_with("127.") || local == "::1"));
  // Debian's 127.0.1.1 for the host's own name is not how other hosts reach it.
  CHECK(listen_host_for("127.0.1.1", false) == "0.0.0.0");
}

TEST_CASE("listen address: one of this host's interfaces, else every interface", "[store]") {
  const std::string mine = first_interface_ipv4();
  if (!mine.empty()) {
    CHECK(listen_host_for(mine, false) == mine);
  }
  // Not this host's (TEST-NET-3, never assigned): it may be a NAT or a
  // virtual address in front of this host, so listen everywhere.
  CHECK(listen_host_for("203.0.113.77", false) == "0.0.0.0");
  CHECK(listen_host_for("2001:db8::77", false) == "::");
  CHECK(listen_host_for("no-such-host.invalid", false) == "0.0.0.0");
}

TEST_CASE("listen address: a store served there is reachable by that address", "[store]") {
  const std::string host = listen_host_for("127.0.0.1", true);
  lockstep::distributed::TcpStoreServer server({.host = host, .port = 0, .token = "t"});
  lockstep::distributed::TcpStore client({.host = "127.0.0.1", .port = server.port(), .token = "t"});
  client.set("k", "v");
  CHECK(client.get_string("k") == "v");
}

TEST_CASE("listen address: which names can only mean this host", "[store]") {
  for (const char* host : {"127.0.0.1", "127.0.1.1", "localhost", "LocalHost.", "::1", "[::1]"}) {
    INFO(host);
    CHECK(names_loopback(host));
  }
  for (const char* host : {"10.0.0.1", "128.0.0.1", "::2", "[::2]", "node7", "", "[]"}) {
    INFO(host);
    CHECK_FALSE(names_loopback(host));
  }
}
