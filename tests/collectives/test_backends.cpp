#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "lockstep/collectives/backends.h"
#include "lockstep/config.h"
#include "lockstep/runtime/error.h"

namespace lc = lockstep::collectives;

TEST_CASE("built_in_backends lists exactly what config.h says is built in",
          "[collectives]") {
  const auto names = lc::built_in_backends();
  const auto has = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  CHECK(has("gloo") == (LOCKSTEP_HAVE_GLOO != 0));
  CHECK(has("mpi") == (LOCKSTEP_HAVE_MPI != 0));
  CHECK(has("nccl") == (LOCKSTEP_HAVE_NCCL != 0));
  CHECK(has("shm"));  // always built in
  CHECK(names.size() ==
        static_cast<size_t>(LOCKSTEP_HAVE_GLOO + LOCKSTEP_HAVE_MPI + LOCKSTEP_HAVE_NCCL + 1));
  CHECK(names.back() == "shm");
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const auto& name : names) CHECK(lc::is_built_in(name));
  CHECK_FALSE(lc::is_built_in("carrier-pigeon"));
}

TEST_CASE("how_to_enable names the apt package and the CMake option", "[collectives]") {
  const auto gloo = lc::how_to_enable("gloo");
  CHECK(gloo.find("libgloo-dev") != std::string::npos);
  CHECK(gloo.find("-DLOCKSTEP_GLOO=ON") != std::string::npos);

  const auto mpi = lc::how_to_enable("mpi");
  CHECK(mpi.find("libopenmpi-dev") != std::string::npos);
  CHECK(mpi.find("-DLOCKSTEP_MPI=ON") != std::string::npos);

  const auto nccl = lc::how_to_enable("nccl");
  CHECK(nccl.find("libnccl-dev") != std::string::npos);
  CHECK(nccl.find("-DLOCKSTEP_NCCL=ON") != std::string::npos);
  CHECK(nccl.find("-DLOCKSTEP_CUDA=ON") != std::string::npos);

  // shm needs nothing beyond POSIX shared memory: no package, no option.
  const auto shm = lc::how_to_enable("shm");
  CHECK(shm.find("always built in") != std::string::npos);
  CHECK(shm.find("-DLOCKSTEP_") == std::string::npos);
}

TEST_CASE("how_to_enable rejects an unknown backend and lists the known ones",
          "[collectives]") {
  CHECK_THROWS_AS(lc::how_to_enable("GLOO"), lockstep::Error);
  CHECK_THROWS_WITH(lc::how_to_enable("tcp"),
                    Catch::Matchers::Contains("unknown collectives backend 'tcp'") &&
                        Catch::Matchers::Contains("gloo, mpi, nccl, shm"));
}
