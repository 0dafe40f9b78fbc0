// A gloo group under a low open-file limit: it raises the soft limit where the
// hard one allows, and otherwise says which limit to raise, where gloo's own
// error ("Unable to find address", a failed connect) hid the EMFILE.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO

#include "collectives/rank_threads.h"
#include "lockstep/runtime/tensor.h"
#include "support/forked_child.h"
#include "support/open_file_limit.h"

namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using lockstep::runtime::Tensor;

namespace {

// In a child: the soft limit leaves room for two more descriptors, the hard
// one `hard_room` more (-1: as it is), then two gloo ranks connect and
// all-reduce.
std::string two_ranks_with_room(long hard_room) {
  return lt::error_in_forked_child([&] {
    lt::limit_open_files(2, hard_room);
    auto groups = lt::make_groups("gloo", 2, "few-files", std::chrono::seconds(5));
    const auto errors = lt::run_ranks(2, [&](int r) {
      Tensor t = Tensor::full({4}, 1.0);
      groups[static_cast<size_t>(r)]->allreduce(t)->wait();
      if (t.to_vector<float>() != std::vector<float>(4, 2.0f))
        throw std::runtime_error("wrong sum");
    });
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  });
}

}  // namespace

TEST_CASE("gloo: a soft open-file limit too low for the group is raised to the hard one",
          "[collectives][gloo]") {
  CHECK(two_ranks_with_room(-1) == "<no exception>");
}

TEST_CASE("gloo: a hard open-file limit too low for the group is named, with what to raise",
          "[collectives][gloo]") {
  CHECK_THAT(two_ranks_with_room(2),
             Contains("of group 'few-files' (2 ranks) needs about 9 more open files") &&
                 Contains("ulimit -n"));
}

#endif  // LOCKSTEP_HAVE_GLOO
