// listen_host_for(): which address a store server listens on, given the
// address its clients reach it by.
#pragma once

#include <string>

namespace lockstep::runtime {

// `host`'s own address where it names one of this machine's interfaces, so
// the store is reachable only where the ranks look for it; else every
// interface ("0.0.0.0", or "::" for an IPv6 host). A loopback address is kept
// only when every client runs on this machine (`clients_on_this_host`):
// Debian maps a host's own name to 127.0.1.1, an address other hosts never
// use for it. A host that does not resolve here gives every interface too;
// connecting to it then fails with the resolver's own error.
std::string listen_host_for(const std::string& host, bool clients_on_this_host);

}  // namespace lockstep::runtime
