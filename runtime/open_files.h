// This process's room for open files (RLIMIT_NOFILE). A part that opens a
// descriptor per peer (gloo's full mesh) makes room before it connects: past
// the limit, its sockets fail one by one with errors that do not say why.
#pragma once

#include <string>

namespace lockstep::runtime {

// Descriptors this process has open now (from /proc/self/fd; -1 where it
// cannot be read).
long open_descriptors();

struct OpenFileRoom {
  bool enough = true;  // `more` fit under the soft limit (raised if need be)
  long open = 0;       // open_descriptors() when asked
  long soft = -1;      // the soft limit afterwards; -1: none
  long hard = -1;      // the hard limit; -1: none
};

// Makes room for `more` descriptors beyond those open now: where the soft
// limit is too low, raises it to the hard one (as a process that needs many
// files should; the hard limit is the administrator's). Says whether they
// fit; where the limits or the count cannot be read, assumes they do.
OpenFileRoom make_room_for_descriptors(long more);

// The end of a refusal for want of room: "this process has <open> open and
// may open at most <hard> (its hard limit, ulimit -Hn): raise the limit
// (ulimit -Hn, or nofile in /etc/security/limits.conf)".
std::string room_shortfall(const OpenFileRoom& room);

}  // namespace lockstep::runtime
