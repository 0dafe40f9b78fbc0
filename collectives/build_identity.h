// What decides whether two ranks can be in one group: lockstep's wire
// protocol (distributed/wire_protocol.h), and where the default backend is
// chosen, the backends built in (a rank without NCCL chooses another default
// than one with it). init_process_group() carries every rank's build
// (version, protocol, backends) in its placement exchange (backend_choice.h)
// and refuses a group whose ranks cannot be paired, on every rank at once,
// naming each build, instead of pairing ranks that read each other's bytes
// differently. Versions of one protocol pair.
#pragma once

#include <string>
#include <vector>

namespace lockstep::collectives {

// This build, as one word for the placement line:
// "lockstep/<version>/wire<N>/<backend>,<backend>,..." (built_in_backends()).
std::string this_build();

// `build` for people: "lockstep 0.1.0 wire 1 (gloo, mpi, shm)". An empty
// `build` is a rank of a lockstep from before builds were published.
std::string describe_build(const std::string& build);

// Whether `word` is a build as this_build() writes it (a placement line's
// first field; before builds were published that field was the backend).
bool is_build(const std::string& word);

// Throws lockstep::Error where the ranks of `group` run builds of different
// wire protocols, or, with `compare_backends` (some rank asked for the
// default backend), different backends built in: `builds[r]` is rank r's (""
// for one from before builds were published), `nodes[r]` its node key. The
// message names each build with its ranks and nodes, and what to do.
void require_same_build(const std::vector<std::string>& builds,
                        const std::vector<std::string>& nodes, const std::string& group,
                        bool compare_backends);

}  // namespace lockstep::collectives
