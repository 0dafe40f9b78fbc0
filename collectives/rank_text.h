// Text across ranks, for the checks that make every rank agree and the
// errors that name each rank: rank 0's message or choice made everybody's,
// and every rank's description gathered in rank order. Each is collective:
// every rank of the group calls it. The bytes travel as i64 words (a dtype
// every backend carries), host tensors whatever the group's device.
#pragma once

#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"

namespace lockstep::collectives {

// `root`'s `text` on every rank (the others' is ignored): two broadcasts,
// the length, then the bytes.
std::string broadcast_text(const std::string& text, ProcessGroup& group, int root = 0);

// Every rank's `mine`, in rank order: two all-gathers, the lengths, then the
// bytes padded to the longest.
std::vector<std::string> allgather_text(const std::string& mine, ProcessGroup& group);

}  // namespace lockstep::collectives
