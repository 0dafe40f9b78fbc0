// Words for a send or recv that timed out, shared by the backends that carry
// them, so that each names the peer and tag alike.
#pragma once

#include <string>

namespace lockstep::collectives {

// What did not happen in time: "rank 1 sent nothing to match it in time (a
// send to this rank with tag 3 on this group)", or for a send that rank 1
// did not receive it. The detail of timeout_message() (call.h) for the call.
std::string p2p_timeout_detail(bool is_send, int peer, int tag);

}  // namespace lockstep::collectives
