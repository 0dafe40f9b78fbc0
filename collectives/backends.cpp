#include "lockstep/collectives/backends.h"

#include <algorithm>
#include <array>

#include "lockstep/config.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives {
namespace {

struct BackendInfo {
  std::string_view name;
  bool built_in;
  std::string_view how_to_enable;
};

constexpr std::array<BackendInfo, 4> kBackends{{
    {"gloo", LOCKSTEP_HAVE_GLOO != 0,
     "install the Debian package libgloo-dev (scripts/setup does) and configure with "
     "-DLOCKSTEP_GLOO=ON (or AUTO, the default, which uses it where found)"},
    {"mpi", LOCKSTEP_HAVE_MPI != 0,
     "install the Debian packages libopenmpi-dev and openmpi-bin (scripts/setup does) and "
     "configure with -DLOCKSTEP_MPI=ON (or AUTO, the default, which uses it where found)"},
    {"nccl", LOCKSTEP_HAVE_NCCL != 0,
     "install the CUDA toolkit with cuBLAS and cuDNN and NCCL (NVIDIA's apt repository: "
     "cuda-toolkit, cudnn9-cuda-<major>, libnccl-dev) and configure with "
     "-DLOCKSTEP_CUDA=ON -DLOCKSTEP_NCCL=ON (or AUTO, the default, which uses them where "
     "found)"},
    {"shm", true,
     "nothing: it is always built in (it needs only POSIX shared memory, /dev/shm)"},
}};

}  // namespace

std::vector<std::string> built_in_backends() {
  std::vector<std::string> names;
  for (const auto& backend : kBackends) {
    if (backend.built_in) names.emplace_back(backend.name);
  }
  return names;
}

bool is_built_in(std::string_view backend) {
  return std::any_of(kBackends.begin(), kBackends.end(), [&](const BackendInfo& b) {
    return b.name == backend && b.built_in;
  });
}

std::string how_to_enable(std::string_view backend) {
  for (const auto& b : kBackends) {
    if (b.name == backend) return fmt::format("to build in the {} backend, {}", b.name, b.how_to_enable);
  }
  throw Error(fmt::format("unknown collectives backend '{}'; known backends: gloo, mpi, nccl, shm",
                          backend));
}

}  // namespace lockstep::collectives
