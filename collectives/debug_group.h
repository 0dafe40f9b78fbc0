// The desync checker (LOCKSTEP_DEBUG=detail): a ProcessGroup wrapper that,
// before forwarding each collective, checks through the store that every rank
// is issuing the same one.
//
// Each rank publishes a fingerprint of the call (sequence number, op, dtype,
// element count, root, reduce op) under "<group>/desync/<instance>/<seq>/<rank>"
// and reads every rank's. When they differ, every rank throws a
// CollectiveError naming the first divergent call and which ranks issued
// what, instead of hanging or computing a wrong answer. A rank that does not
// arrive within the call's timeout is named with its last recorded call; one
// that destroyed its group is named at once, as having called nothing more.
// Sends and recvs involve two ranks only and are forwarded unchecked.
//
// Costs a few store round trips per collective; meant for debugging.
#pragma once

#include <memory>
#include <string>

#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

// `label` names the group in errors; empty: "group '<name>' (<backend>)". A
// subgroup's says whose ranks its ranks are.
std::shared_ptr<ProcessGroup> make_debug_group(std::shared_ptr<ProcessGroup> inner,
                                               std::shared_ptr<distributed::Store> store,
                                               std::string label = {});

}  // namespace lockstep::collectives
