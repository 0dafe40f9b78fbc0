// Collectives handed tensors that share memory: an allgather input that lies
// in its own output, a reduce_scatter output that lies in its own input, in
// place or elsewhere, on every CPU backend built in.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "support/backend_skip.h"
#include "lockstep/config.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;

TEST_CASE("allgather: an input inside the output gathers every rank's values, wherever it lies",
          "[collectives]") {
  const int size = GENERATE(2, 3);
  // 300000 f32 elements take several rounds of shm's 1 MiB staging buffer.
  const int64_t n = GENERATE(int64_t{5}, int64_t{300000});
  // Where each rank's input lies in its output: the first chunk (another
  // rank's place on every rank but 0), the last, or its own (in place).
  const std::string where = GENERATE("first", "last", "own");
  for (const auto& backend : lt::cpu_backends()) {
    INFO(backend << ", " << size << " ranks, " << n << " elements, input at the " << where
                 << " chunk");
    auto groups = lt::make_groups(backend, size, "overlap");
    std::vector<std::string> failures(static_cast<size_t>(size));
    const auto errors = lt::run_ranks(size, [&](int r) {
      Tensor out = Tensor::zeros({size * n}, DType::f32);
      const int64_t chunk = where == "first" ? 0 : where == "last" ? size - 1 : r;
      Tensor in = out.slice(0, chunk * n, (chunk + 1) * n);
      in.copy_(lt::input(r, n, DType::f32));
      groups[static_cast<size_t>(r)]->allgather(out, in)->wait();
      const auto* got = static_cast<const float*>(out.raw_data());
      for (int q = 0; q < size && failures[static_cast<size_t>(r)].empty(); ++q) {
        for (int64_t i = 0; i < n; ++i) {
          const auto want = static_cast<float>(lt::input_value(q, i));
          if (got[q * n + i] != want) {
            failures[static_cast<size_t>(r)] =
                fmt::format("rank {}: chunk {} element {} is {}, expected {}", r, q, i,
                            got[q * n + i], want);
            break;
          }
        }
      }
    });
    for (int r = 0; r < size; ++r) {
      CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
      if (!failures[static_cast<size_t>(r)].empty()) FAIL_CHECK(failures[static_cast<size_t>(r)]);
    }
  }
}

TEST_CASE("reduce_scatter: an output inside the input gets its chunk's reduction, wherever it lies",
          "[collectives]") {
  const int size = GENERATE(2, 3);
  // 300000 f32 elements take several rounds of shm's staging buffer.
  const int64_t n = GENERATE(int64_t{5}, int64_t{300000});
  // Where each rank's output lies in its input: its own chunk (in place),
  // the first or the last chunk, or across two chunks (from the middle of
  // the first).
  const std::string where = GENERATE("own", "first", "last", "across");
  for (const auto& backend : lt::cpu_backends()) {
    INFO(backend << ", " << size << " ranks, " << n << " elements, output at the " << where
                 << " chunk");
    auto groups = lt::make_groups(backend, size, "overlap");
    // Rank q's element j: distinct along the input, so that a value read
    // from the wrong place shows (exact in f32).
    const auto value = [](int q, int64_t j) { return static_cast<float>(100 * q + j % 89); };
    std::vector<std::string> failures(static_cast<size_t>(size));
    const auto errors = lt::run_ranks(size, [&](int r) {
      std::vector<float> v(static_cast<size_t>(size * n));
      for (int64_t j = 0; j < size * n; ++j) v[static_cast<size_t>(j)] = value(r, j);
      Tensor in = Tensor::from_vector(v, {size * n});
      const int64_t start = where == "own"     ? r * n
                            : where == "first" ? 0
                            : where == "last"  ? (size - 1) * n
                                               : n / 2;
      Tensor out = in.slice(0, start, start + n);
      groups[static_cast<size_t>(r)]->reduce_scatter(out, in)->wait();
      const auto* got = static_cast<const float*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < size; ++q) want += value(q, r * n + i);
        if (got[i] != want) {
          failures[static_cast<size_t>(r)] =
              fmt::format("rank {}: element {} is {}, expected {}", r, i, got[i], want);
          break;
        }
      }
    });
    for (int r = 0; r < size; ++r) {
      CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
      if (!failures[static_cast<size_t>(r)].empty()) FAIL_CHECK(failures[static_cast<size_t>(r)]);
    }
  }
}
