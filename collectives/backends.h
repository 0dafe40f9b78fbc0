// Which collectives backends this build of lockstep has, and how to get the
// others.
//
// A backend that is not built in is absent, not stubbed: code that needs one
// asks built_in_backends() and, when it is missing, reports how_to_enable().
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::collectives {

// Names of the backends compiled into this build, in a fixed order:
// "gloo", "mpi", "nccl" (each only where built in; see lockstep/config.h),
// then "shm" (always).
std::vector<std::string> built_in_backends();

// True when `backend` is one of built_in_backends().
bool is_built_in(std::string_view backend);

// One sentence saying how to build `backend` in: the apt package to install
// and the CMake option to set. The same whether or not it is built in here.
// Throws lockstep::Error for a name that is not a known backend.
std::string how_to_enable(std::string_view backend);

}  // namespace lockstep::collectives
