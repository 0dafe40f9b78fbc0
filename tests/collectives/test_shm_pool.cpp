// The shm backend's shared tensor pools (ProcessGroup::reserve_shared_pool),
// one thread per rank: all-reduce and reduce of pool tensors (read in place)
// with exact results, a rank whose tensor is outside the pool, allocation and
// reuse, a pool too large for /dev/shm, tensors that outlive their group, and
// that no /dev/shm file is left behind.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/collectives/shm/shm_segment.h"
#include "support/backend_skip.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using lt::add_failure;
using lt::on_every_rank;

namespace {

using Groups = std::vector<std::shared_ptr<lc::ProcessGroup>>;

// Counts above the one-round path's 32 KiB for every dtype, divisible by none
// of 2, 3 and 4.
constexpr int64_t kLarge = 16384 + 4099;

std::shared_ptr<lc::SharedTensorPool> reserve(lc::ProcessGroup& g, size_t bytes,
                                              std::vector<std::string>& failures) {
  auto pool = g.reserve_shared_pool(bytes);
  if (pool == nullptr) failures.push_back(fmt::format("no pool of {} bytes", bytes));
  return pool;
}

// `rank`'s input as a tensor in `pool` (or, with no pool, an ordinary one).
Tensor input_in(lc::SharedTensorPool* pool, int rank, int64_t n, DType dtype) {
  Tensor source = lt::input(rank, n, dtype);
  if (pool == nullptr) return source;
  Tensor t = pool->empty({n}, dtype);
  if (!t.defined()) return source;
  t.copy_(source);
  return t;
}

std::string reduced_mismatch(const Tensor& t, lc::ReduceOp op, DType dtype, int size,
                             const std::string& what) {
  return lt::mismatch(t, [&](int64_t i) { return lt::expected_value(op, dtype, size, i); }, what);
}

std::vector<std::string> own_shm_files() {
  const std::string prefix = lc::shm::segment_prefix() + std::to_string(::getpid()) + "-";
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

}  // namespace

TEST_CASE("shm pool: all-reduce and reduce of pool tensors, every op, dtype and root",
          "[collectives][shm][pool]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups("shm", size, "pool");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    auto pool = reserve(g, 1 << 20, failures);
    if (!pool) return;
    for (DType dtype : lt::kDTypes) {
      for (lc::ReduceOp op : lt::kOps) {
        Tensor t = input_in(pool.get(), g.rank(), kLarge, dtype);
        if (!pool->holds(t)) failures.push_back("a pool tensor is not in the pool");
        g.allreduce(t, {.op = op, .timeout = {}})->wait();
        add_failure(failures, reduced_mismatch(t, op, dtype, size,
                                               fmt::format("allreduce {} {}", dtype_name(dtype),
                                                           lc::to_string(op))));
      }
    }
    for (int root = 0; root < size; ++root) {
      for (lc::ReduceOp op : lt::kOps) {
        Tensor t = input_in(pool.get(), g.rank(), kLarge, DType::f64);
        g.reduce(t, {.op = op, .root = root, .timeout = {}})->wait();
        if (g.rank() != root) continue;
        add_failure(failures, reduced_mismatch(t, op, DType::f64, size,
                                               fmt::format("reduce {} root {}", lc::to_string(op),
                                                           root)));
      }
    }
    // Every allocation above went back to the pool.
    if (pool->used_bytes() != 0) {
      failures.push_back(fmt::format("{} bytes still in use", pool->used_bytes()));
    }
  });
}

TEST_CASE("shm pool: a rank whose tensor lies outside the pool, or a view into one",
          "[collectives][shm][pool]") {
  const int size = GENERATE(2, 3);
  const auto groups = lt::make_groups("shm", size, "pool-mixed");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    auto pool = reserve(g, 1 << 20, failures);
    if (!pool) return;
    for (int outsider = 0; outsider < size; ++outsider) {
      Tensor t = input_in(g.rank() == outsider ? nullptr : pool.get(), g.rank(), kLarge, DType::f32);
      g.allreduce(t)->wait();
      add_failure(failures, reduced_mismatch(t, lc::ReduceOp::Sum, DType::f32, size,
                                             fmt::format("rank {} outside", outsider)));
    }
    // A view at an offset inside a pool tensor: the offset travels along.
    Tensor whole = pool->empty({kLarge + 100}, DType::f32);
    whole.fill_(-1);
    Tensor part = whole.slice(0, 37, 37 + kLarge);
    part.copy_(lt::input(g.rank(), kLarge, DType::f32));
    g.allreduce(part, {.op = lc::ReduceOp::Max, .timeout = {}})->wait();
    add_failure(failures, reduced_mismatch(part, lc::ReduceOp::Max, DType::f32, size, "view"));
    const auto around = whole.to_vector<float>();
    if (around[36] != -1 || around[37 + kLarge] != -1) failures.push_back("wrote outside the view");
  });
}

TEST_CASE("shm pool: tensors come and go, first fit, full pool", "[collectives][shm][pool]") {
  const auto groups = lt::make_groups("shm", 2, "pool-alloc");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    auto pool = reserve(g, 4096, failures);
    if (!pool) return;
    if (pool->capacity_bytes() != 4096) failures.push_back("capacity is not what was asked");
    {
      Tensor a = pool->empty({256}, DType::f32);  // 1 KiB each
      Tensor b = pool->empty({256}, DType::f32);
      Tensor c = pool->empty({256}, DType::f32);
      Tensor d = pool->empty({256}, DType::f32);
      if (!a.defined() || !b.defined() || !c.defined() || !d.defined()) {
        failures.push_back("four 1 KiB tensors do not fit in 4 KiB");
        return;
      }
      if (pool->empty({1}, DType::f32).defined()) failures.push_back("a full pool gave a tensor");
      const auto* first = static_cast<const std::byte*>(a.raw_data());
      b = Tensor();
      a = Tensor();  // a and b join into one 2 KiB block at the start
      Tensor e = pool->empty({512}, DType::f32);
      if (!e.defined() || e.raw_data() != first) failures.push_back("freed blocks were not joined");
      if (pool->used_bytes() != 4096) failures.push_back("used bytes do not add up");
    }
    if (pool->used_bytes() != 0) failures.push_back("tensors gone, bytes still used");
    if (!pool->empty({1024}, DType::f32).defined()) failures.push_back("an empty pool is not whole");
    if (pool->holds(Tensor::zeros({4}))) failures.push_back("holds() an ordinary tensor");
  });
}

TEST_CASE("shm pool: a pool of any size holds one tensor of that size",
          "[collectives][shm][pool]") {
  const auto groups = lt::make_groups("shm", 2, "pool-odd");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (int64_t count : {1, 25, 250, 1023}) {  // 4 to 4092 bytes: no whole cache lines
      auto pool = reserve(g, static_cast<size_t>(count) * 4, failures);
      if (!pool) return;
      Tensor t = pool->empty({count}, DType::f32);
      if (!t.defined()) {
        failures.push_back(fmt::format("a pool of {} bytes holds no tensor of {} floats",
                                       count * 4, count));
        continue;
      }
      t.copy_(lt::input(g.rank(), count, DType::f32));
      g.allreduce(t)->wait();
      add_failure(failures, reduced_mismatch(t, lc::ReduceOp::Sum, DType::f32, 2,
                                             fmt::format("{} floats", count)));
    }
  });
  CHECK(own_shm_files().empty());
}

TEST_CASE("shm pool: one too large for /dev/shm is refused on every rank alike",
          "[collectives][shm][pool]") {
  const auto groups = lt::make_groups("shm", 3, "pool-huge");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    if (g.reserve_shared_pool(size_t{1} << 50) != nullptr) failures.push_back("a 1 PiB pool");
    // The group works on, with and without a pool.
    Tensor t = lt::input(g.rank(), kLarge, DType::f32);
    g.allreduce(t)->wait();
    add_failure(failures, reduced_mismatch(t, lc::ReduceOp::Sum, DType::f32, 3, "after refusal"));
    auto pool = reserve(g, 1 << 20, failures);
    if (pool && !pool->empty({kLarge}, DType::f32).defined()) failures.push_back("no tensor");
  });
  CHECK(own_shm_files().empty());
}

TEST_CASE("shm pool: other backends have none; the desync checker passes shm's through",
          "[collectives][shm][pool]") {
  for (const auto& [backend, debug, expect] :
       {std::tuple{"gloo", lockstep::distributed::DebugLevel::Off, false},
        std::tuple{"shm", lockstep::distributed::DebugLevel::Detail, true}}) {
    if (!lt::backend_skip_reason(backend).empty()) continue;  // gloo not built in
    const auto groups = lt::make_groups(backend, 2, "pool-backends", std::chrono::seconds(60), debug);
    on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
      if ((g.reserve_shared_pool(1 << 16) != nullptr) != expect) {
        failures.push_back(fmt::format("{}: a pool is {}expected", backend, expect ? "" : "not "));
      }
    });
  }
}

TEST_CASE("shm pool: tensors outlive their group; nothing is left in /dev/shm",
          "[collectives][shm][pool]") {
  std::vector<Tensor> kept(2);
  {
    const auto groups = lt::make_groups("shm", 2, "pool-outlive");
    on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
      auto pool = reserve(g, 1 << 16, failures);
      if (!pool) return;
      Tensor t = input_in(pool.get(), g.rank(), 4000, DType::f64);
      g.allreduce(t)->wait();
      kept[static_cast<size_t>(g.rank())] = t;
    });
    // Every rank has mapped every segment: their names are gone already.
    CHECK(own_shm_files().empty());
  }
  for (const Tensor& t : kept) {
    REQUIRE(t.defined());
    CHECK(reduced_mismatch(t, lc::ReduceOp::Sum, DType::f64, 2, "kept") == "");
  }
  kept.clear();
  CHECK(own_shm_files().empty());
}
