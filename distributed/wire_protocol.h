// lockstep's wire protocol number: what the ranks of one group, and a rank
// and the lockstep-run that started it, must share to talk at all. Ranks of
// builds with different numbers are refused at init_process_group()
// (collectives/build_identity.h), and a rank started by a lockstep-run of
// another number is refused as it reads its environment (launch_env.h).
//
// Change kWireProtocol whenever any layout that crosses a process changes:
//   - the line each rank publishes in init_process_group()'s placement
//     exchange (backend_choice.h's format_placement, build_identity.h);
//   - the shm segment's header and slots (collectives/shm/shm_comm.cpp);
//   - the packed collective signature (collectives/call.h) and gloo's
//     exchange of it (collectives/gloo/gloo_call_check.cpp);
//   - gloo's send/recv message header (collectives/gloo/gloo_group.cpp);
//   - store key names and the TCP store's messages (distributed/store/);
//   - the launcher's heartbeat bytes (runtime/liveness.h) and the variables
//     it gives a rank (launch_env.h, launcher/child_env.cpp).
#pragma once

#include "lockstep/runtime/env.h"

namespace lockstep::distributed {

inline constexpr int kWireProtocol = 2;

// Set by lockstep-run in each rank's environment: its kWireProtocol and its
// version (for the message when the rank's differs).
inline constexpr const char* kLauncherWireVar = "LOCKSTEP_LAUNCHER_WIRE";
inline constexpr const char* kLauncherVersionVar = "LOCKSTEP_LAUNCHER_VERSION";

// For a rank lockstep-run started: throws lockstep::Error, naming both
// builds, where `env`'s LOCKSTEP_LAUNCHER_WIRE is not this build's
// kWireProtocol (or not a number). Where it is unset (a launcher from before
// it was set, or rank variables set by hand) nothing can be checked.
void require_launcher_wire(const runtime::EnvLookup& env);

}  // namespace lockstep::distributed
