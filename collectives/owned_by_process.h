// A group handle that only the process which made the group destroys.
#pragma once

#include <unistd.h>

#include <memory>

#include "lockstep/collectives/process_group.h"

namespace lockstep::collectives {

// `group`, kept alive by `owner`, which only the process that made it
// destroys. A child forked from that process (ending with exit(), a group held
// globally) has none of the group's threads and shares its sockets, memory
// and store server with the parent: destroying it there waited without end
// on threads that are not there, or crashed, and could tell the parent's
// peers that this rank had left. The child leaves it to its own end.
template <class Owner>
std::shared_ptr<ProcessGroup> owned_by_this_process(std::shared_ptr<Owner> owner,
                                                    ProcessGroup* group) {
  auto* kept = new std::shared_ptr<Owner>(std::move(owner));
  return std::shared_ptr<ProcessGroup>(group, [kept, maker = ::getpid()](ProcessGroup*) {
    if (::getpid() == maker) delete kept;
  });
}

}  // namespace lockstep::collectives
