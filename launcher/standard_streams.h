// The launcher's stdin, stdout and stderr, when it was started with one of
// them closed (`>&-`, a daemon that closed its descriptors): the next
// descriptor it opened would take that number, and a store connection on
// descriptor 1 would get the ranks' tagged output and the launcher's
// messages written into it, breaking the node's link to the store.
#pragma once

namespace lockstep::launcher {

// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed, as glibc
// does for a set-user-ID program. Call before anything else is opened.
void open_closed_standard_streams();

}  // namespace lockstep::launcher
