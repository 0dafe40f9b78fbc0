// The gloo backend: Debian's libgloo over its TCP transport.
//
// Rendezvous goes through our Store (adapted to gloo's store interface under
// a per-group prefix). Collectives run in issue order on one background
// thread per group, so the Work returned is truly asynchronous.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

// `bind_address`: the local IP address gloo listens on (peers connect to it);
// "127.0.0.1" for ranks of one host. Sets SIGPIPE to be ignored where its
// action is the default, as Python does: a write to a peer that has gone
// then fails with an error naming it instead of killing this process.
std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<distributed::Store> store, int rank,
                                              int size, const std::string& name,
                                              std::chrono::milliseconds timeout,
                                              const std::string& bind_address);

}  // namespace lockstep::collectives
