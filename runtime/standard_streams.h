// A process started with stdin, stdout or stderr closed (`>&-`, a daemon that
// closed its descriptors): the next descriptor it opens takes that number.
// A store socket on descriptor 1 or 2 would get the program's prints and
// lockstep's warnings written into it, breaking the rank's link to the
// store; a socket or pipe on descriptor 0 would be a child's stdin.
#pragma once

namespace lockstep::runtime {

// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed, as glibc
// does for a set-user-ID program. Called by lockstep-run before anything
// else is opened, and by init_process_group() before its store.
void open_closed_standard_streams();

}  // namespace lockstep::runtime
