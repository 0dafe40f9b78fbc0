#include "lockstep/collectives/p2p_text.h"

#include <fmt/format.h>

namespace lockstep::collectives {

std::string p2p_timeout_detail(bool is_send, int peer, int tag) {
  return fmt::format("rank {} {} in time (a {} with tag {} on this group)", peer,
                     is_send ? "did not receive it" : "sent nothing to match it",
                     is_send ? "recv from this rank" : "send to this rank", tag);
}

}  // namespace lockstep::collectives
