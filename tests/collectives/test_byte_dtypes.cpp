// u8 and bool tensors (masks, flags, pickled objects as bytes) go through
// every collective of the CPU backends, reducing as PyTorch does: u8 Sum and
// Product wrap modulo 256, bool Sum and Max are a logical or, Product and
// Min a logical and. Avg of either is refused before anything is sent.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/config.h"
#include "support/backend_skip.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lc::ReduceOp;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;

namespace {

const int64_t kCount = 37;

// Rank r's element i: u8 values near 255 (so sums and products wrap), bool
// ones true on some ranks only.
int byte_of(DType dtype, int r, int64_t i) {
  if (dtype == DType::boolean) return (r + i) % 3 == 0 || (i % 5 == 0) ? 1 : 0;
  return static_cast<int>((200 + 37 * r + 11 * i) % 256);
}

Tensor make(DType dtype, int64_t n, int r, int64_t offset = 0) {
  Tensor t = Tensor::empty({n}, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(byte_of(dtype, r, i + offset));
  return t;
}

std::vector<int> bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return {p, p + t.numel()};
}

// The reduction over `size` ranks, computed in int and taken modulo 256.
int expected(DType dtype, ReduceOp op, int size, int64_t i) {
  int acc = byte_of(dtype, 0, i);
  for (int r = 1; r < size; ++r) {
    const int v = byte_of(dtype, r, i);
    switch (op) {
      case ReduceOp::Sum: acc = dtype == DType::boolean ? (acc | v) : (acc + v) % 256; break;
      case ReduceOp::Product: acc = dtype == DType::boolean ? (acc & v) : (acc * v) % 256; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::Avg: break;
    }
  }
  return acc;
}

void compare(std::vector<std::string>& failures, const std::string& what, const Tensor& t,
             const std::vector<int>& want) {
  const auto got = bytes(t);
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      failures.push_back(fmt::format("{}: element {} is {}, expected {}", what, i, got[i],
                                     want[i]));
      return;
    }
  }
}

void check_bytes(const std::string& backend, int size, DType dtype) {
  const auto groups = lt::make_groups(backend, size, "bytes");
  const std::string name = std::string(dtype_name(dtype));
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    const int rank = g.rank();
    const int root = size - 1;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max}) {
      std::vector<int> want;
      for (int64_t i = 0; i < kCount; ++i) want.push_back(expected(dtype, op, size, i));
      Tensor all = make(dtype, kCount, rank);
      g.allreduce(all, {.op = op, .timeout = {}})->wait();
      compare(failures, fmt::format("{} allreduce {}", name, to_string(op)), all, want);

      Tensor one = make(dtype, kCount, rank);
      g.reduce(one, {.op = op, .root = root, .timeout = {}})->wait();
      if (rank == root) {
        compare(failures, fmt::format("{} reduce {}", name, to_string(op)), one, want);
      }

      // Rank r's input chunk c holds elements c * 5 .. c * 5 + 4 of the whole.
      Tensor in = make(dtype, 5 * size, rank);
      Tensor out = Tensor::empty({5}, dtype);
      g.reduce_scatter(out, in, {.op = op, .timeout = {}})->wait();
      std::vector<int> mine;
      for (int64_t i = 0; i < 5; ++i) mine.push_back(expected(dtype, op, size, rank * 5 + i));
      compare(failures, fmt::format("{} reduce_scatter {}", name, to_string(op)), out, mine);
    }

    Tensor b = rank == root ? make(dtype, kCount, root) : Tensor::zeros({kCount}, dtype);
    g.broadcast(b, {.root = root, .timeout = {}})->wait();
    compare(failures, name + " broadcast", b, bytes(make(dtype, kCount, root)));

    Tensor gathered = Tensor::zeros({kCount * size}, dtype);
    g.allgather(gathered, make(dtype, kCount, rank))->wait();
    std::vector<int> want;
    for (int r = 0; r < size; ++r) {
      for (int v : bytes(make(dtype, kCount, r))) want.push_back(v);
    }
    compare(failures, name + " allgather", gathered, want);

    // shm sends point to point through gloo: without it there is no send.
    if (!LOCKSTEP_HAVE_GLOO) return;
    if (rank == 0) {
      g.send(make(dtype, kCount, 0, 3), 1)->wait();
    } else if (rank == 1) {
      Tensor got = Tensor::zeros({kCount}, dtype);
      g.recv(got, 0)->wait();
      compare(failures, name + " recv", got, bytes(make(dtype, kCount, 0, 3)));
    }
  });
}

}  // namespace

TEST_CASE("u8 and bool tensors go through every collective and reduce as PyTorch",
          "[collectives]") {
  const std::string backend = GENERATE(from_range(lt::cpu_backends()));
  const int size = GENERATE(2, 3);
  const DType dtype = GENERATE(DType::u8, DType::boolean);
  INFO(backend << ", " << size << " ranks, " << dtype_name(dtype));
  check_bytes(backend, size, dtype);
}

TEST_CASE("Avg of u8 and bool is refused before anything is sent and names the dtype",
          "[collectives]") {
  const std::string backend = GENERATE(from_range(lt::cpu_backends()));
  const DType dtype = GENERATE(DType::u8, DType::boolean);
  const auto groups = lt::make_groups(backend, 2, "bytes-avg");
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    Tensor t = Tensor::zeros({4}, dtype);
    Tensor out = Tensor::zeros({2}, dtype);
    const std::vector<std::pair<std::string, std::function<void()>>> calls = {
        {"allreduce", [&] { g.allreduce(t, {.op = ReduceOp::Avg, .timeout = {}}); }},
        {"reduce", [&] { g.reduce(t, {.op = ReduceOp::Avg, .root = 0, .timeout = {}}); }},
        {"reduce_scatter",
         [&] { g.reduce_scatter(out, t, {.op = ReduceOp::Avg, .timeout = {}}); }}};
    for (const auto& [op, call] : calls) {
      try {
        call();
        failures.push_back(op + " with Avg was not refused");
      } catch (const std::exception& e) {
        const std::string what = e.what();
        if (what.find(op) == std::string::npos || what.find("Avg") == std::string::npos ||
            what.find(std::string(dtype_name(dtype))) == std::string::npos) {
          failures.push_back(op + ": the error does not name the op, Avg and the dtype: " + what);
        }
      }
    }
    // The group is still in step: a Sum goes through on every rank.
    Tensor ones = Tensor::ones({4}, dtype);
    g.allreduce(ones, {.op = ReduceOp::Max, .timeout = {}})->wait();
    compare(failures, "Max after the refusals", ones, {1, 1, 1, 1});
  });
}
