#include "support/mpirun.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "lockstep/config.h"

namespace lockstep::testing {

std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/mpirun";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

std::string mpi_skip_reason() {
  if (LOCKSTEP_HAVE_MPI == 0) {
    return "lockstep built without MPI (install libopenmpi-dev openmpi-bin, configure with "
           "-DLOCKSTEP_MPI=ON)";
  }
  if (find_mpirun().empty()) return "mpirun not found on PATH (apt-get install openmpi-bin)";
  return {};
}

ProcessResult run_under_mpirun(int ranks, const std::string& worker,
                               const std::vector<std::string>& args,
                               std::chrono::milliseconds limit,
                               const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv = {find_mpirun(), "--oversubscribe", "-np", std::to_string(ranks),
                                   "--bind-to", "none", "--mca", "btl", "self,vader",
                                   bin_path(worker)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                  "OMPI_MCA_btl_vader_single_copy_mechanism=none"};
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  return run_process(argv, limit, env);
}

}  // namespace lockstep::testing
