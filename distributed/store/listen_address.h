// Where a store server listens and what it tells other hosts: the address
// its clients reach it by, and this host's own address.
#pragma once

#include <string>

namespace lockstep::distributed {

// `host`'s own address where it names one of this machine's interfaces, so
// the store is reachable only where the ranks look for it; else every
// interface ("0.0.0.0", or "::" for an IPv6 host). A loopback address is kept
// only when every client runs on this machine (`clients_on_this_host`):
// Debian maps a host's own name to 127.0.1.1, an address other hosts never
// use for it. A host that does not resolve here gives every interface too;
// connecting to it then fails with the resolver's own error.
std::string listen_host_for(const std::string& host, bool clients_on_this_host);

// Whether `host` can only mean this machine on every host: "localhost" or a
// numeric loopback address (127.x.y.z, ::1). A name that this machine maps
// to loopback (Debian's 127.0.1.1 for its own name) is not: other hosts
// resolve it to this machine's real address.
bool names_loopback(const std::string& host);

// Whether this machine's loopback interface (`lo`) is up. Only a down `lo`
// makes a loopback address unroutable for good: connect's EADDRNOTAVAIL
// there also means no ephemeral port is free yet, which passes.
bool loopback_interface_up();

// This host's first non-loopback IPv4 address (what other hosts may reach it
// by when no address is given), or empty when it has none.
std::string first_interface_ipv4();

}  // namespace lockstep::distributed
