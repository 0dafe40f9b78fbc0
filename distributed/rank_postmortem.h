// A rank's own post-mortem, for launchers that do not read its flight
// recorder: mpirun, torchrun, srun.
//
// With LOCKSTEP_POSTMORTEM_DIR set, the first collective of this process
// that fails (times out, finds a peer gone, or is called differently on
// another rank) has the process write its last collectives to
// DIR/lockstep-postmortem-rank<R>.json and name the file on stderr. The ranks
// that saw the failure write theirs, and ask the others for theirs through
// DIR/lockstep-postmortem-asked. Every rank watches for that file from its
// first process group on (one stat() a second) and, once asked by a rank of
// its own launch (another job sharing DIR is not answered), writes its
// part with no cause of its own: a rank stuck outside the collectives (a
// deadlock in its own code, a data loader that never returns) shows its last
// collective instead of nothing. A rank that wrote the part of its failure
// waits up to 2 s for the others' before the failure goes on, since another
// launcher ends the job as soon as one rank exits. `lockstep-run
// --postmortem-from DIR` merges the parts into one report, which names the
// ranks that wrote none (stopped, killed, exited first, or not seeing DIR:
// ranks on several nodes need a directory they share). Under lockstep-run
// (LOCKSTEP_FLIGHT_RECORDER set) the launcher reads the recorders itself and
// nothing is written here.
#pragma once

#include <optional>
#include <string>

#include "lockstep/runtime/env.h"

namespace lockstep::distributed {

inline constexpr const char* kPostmortemDirVariable = "LOCKSTEP_POSTMORTEM_DIR";

// Writes this process's part now, for `cause`, when `env` asks for it;
// returns the file written. A file that cannot be written is said on
// stderr: a diagnostic never stops a run.
std::optional<std::string> write_rank_postmortem(const runtime::EnvLookup& env,
                                                 const std::string& cause);

// The recorder's hooks. The first process group or collective starts the
// watch of DIR (after that, one atomic load); the first failed one (`ordinal`, FlightRecorder's)
// writes the part, described by that record, over an answer written before.
void watch_for_postmortems();
void on_collective_failed(uint64_t ordinal);

}  // namespace lockstep::distributed
