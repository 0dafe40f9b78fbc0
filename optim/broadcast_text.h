// Rank 0's text on every rank: how the training helpers make one rank's
// error message, or a path it picked, everybody's.
#pragma once

#include <string>

#include "lockstep/collectives/process_group.h"

namespace lockstep::optim {

// Every rank of `group` calls it; returns rank 0's `text` (the others' is
// ignored). Two broadcasts: the length, then the bytes. Null group or one
// rank: `text` itself.
std::string broadcast_text(const std::string& text, collectives::ProcessGroup* group);

}  // namespace lockstep::optim
