// The launcher holds descriptors for every rank it starts: a heartbeat socket,
// two output pipes with --tag-output, and on node 0 one store connection per
// rank of the job and four per other node's launcher. Started past the
// open-file limit, it would fail halfway through starting the ranks; so
// before the first one starts it raises its soft limit (RLIMIT_NOFILE) as
// far as the hard limit allows, and refuses the job when even that is too
// few. The ranks inherit the raised limit.
#pragma once

#include "launcher/options.h"

namespace lockstep::launcher {

// Descriptors the launcher needs for `options`' ranks: those open now, its
// own and each rank's.
long descriptors_needed(const Options& options);

// Raises the soft limit towards what the job needs; throws UsageError, naming
// both numbers and what to do, when the hard limit is below it.
void ensure_descriptor_limit(const Options& options);

}  // namespace lockstep::launcher
