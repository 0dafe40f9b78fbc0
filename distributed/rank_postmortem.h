// A rank's own post-mortem, for launchers that do not read its flight
// recorder: mpirun, torchrun, srun.
//
// With LOCKSTEP_POSTMORTEM_DIR set, the first collective of this process
// that fails (times out, finds a peer gone, or is called differently on
// another rank) has the process write its last collectives to
// DIR/lockstep-postmortem-rank<R>.json and name the file on stderr. The ranks
// that saw the failure write theirs; `lockstep-run --postmortem-from DIR`
// merges them into one report, which names the ranks that wrote none (hung,
// killed, or never in a failed collective). Under lockstep-run
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

// The recorder's hook: the first failed collective of this process
// (`ordinal`, FlightRecorder's) writes the part, described by that record.
void on_collective_failed(uint64_t ordinal);

}  // namespace lockstep::distributed
