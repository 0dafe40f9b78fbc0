// Started by mpirun (tests/collectives/test_multiprocess_mpi.cpp): runs every
// collective of the mpi backend for every dtype and reduce op, at element
// counts 0, 1, 7 and 1001 (not divisible by the world size), and checks each
// result against values computed here from the inputs.
//
// Inputs are small integers, so every sum, product, min and max is exact in
// bf16 and f16 too and results are compared exactly.
//
// Prints "mpi_collective_worker rank R/N: OK (<checks> checks)" and exits 0,
// or prints the first mismatch and exits 1 at once (without MPI_Finalize, so
// mpirun stops the other ranks instead of leaving them in a collective).
//
// Flags: --die-at-rank R   rank R exits with code 3 before the first collective
//        --timeout-case    after the checks, rank 0 alone issues a barrier with
//                          a 300 ms timeout and checks the error (the job then
//                          ends non-zero: that barrier never completes)
//        --p2p-timeout-case  the same with a recv from rank 1, which sends nothing
//        --timeout-ms T    the group's timeout (default 60000)
//        --diverge-at-rank R  before the checks, rank R all-reduces 2 i64 where
//                          the others all-reduce 1000 f32: every rank must fail
//                          naming both calls
#include "lockstep/config.h"

#if LOCKSTEP_HAVE_MPI

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/collectives/mpi/mpi_group.h"
#include "lockstep/collectives/new_group.h"
#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/runtime/tensor.h"

// Options spell out `.timeout = {}`: GCC 12 warns about members a designated
// initializer leaves out (-Wmissing-field-initializers).

namespace lc = lockstep::collectives;
namespace lr = lockstep::runtime;
using lc::ReduceOp;
using lr::Tensor;

namespace {

int g_rank = 0;
int g_size = 1;

[[noreturn]] void fail(const std::string& message) {
  fmt::print("mpi_collective_worker rank {}/{}: FAILED: {}\n", g_rank, g_size, message);
  std::fflush(stdout);
  std::_Exit(1);
}

const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max,
                                    ReduceOp::Product};
const std::vector<int64_t> kCounts = {0, 1, 7, 1001};

// Rank r's i-th input for `op`: small integers (|sum| <= 30, |product| <= 16
// for 4 ranks), so results are exact in every dtype; negative sums exercise
// Avg's truncation toward zero for integers.
int64_t input(ReduceOp op, int r, int64_t i) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return (r + 1) * ((i % 7) - 3);
    case ReduceOp::Product: {
      const int64_t k = (r + i) % 3;
      return k == 0 ? 2 : (k == 1 ? -1 : 1);
    }
    case ReduceOp::Min:
    case ReduceOp::Max: return (r * 7 + i * 3) % 11 - 5;
  }
  return 0;
}

template <class T>
T from_int(int64_t v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return static_cast<T>(v);
  } else {
    return T(static_cast<float>(v));  // bf16, f16
  }
}

template <class T>
T from_nan() {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::numeric_limits<T>::quiet_NaN();
  } else {
    return T(std::numeric_limits<float>::quiet_NaN());
  }
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return static_cast<double>(v);
  } else {
    return static_cast<double>(static_cast<float>(v));
  }
}

// The reduction over all ranks of input(op, r, i), in T, as the backend
// defines it: Avg is the sum divided by the size (integers truncate).
template <class T>
double expected_reduction(ReduceOp op, int64_t i) {
  int64_t acc = input(op, 0, i);
  for (int r = 1; r < g_size; ++r) {
    const int64_t v = input(op, r, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Product: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  if (op != ReduceOp::Avg) return to_double(from_int<T>(acc));
  if constexpr (std::is_integral_v<T>) {
    return static_cast<double>(acc / g_size);
  } else if constexpr (std::is_floating_point_v<T>) {
    return to_double(static_cast<T>(acc) / static_cast<T>(g_size));
  } else {
    return to_double(T(static_cast<float>(acc) / static_cast<float>(g_size)));
  }
}

template <class T, class Fn>
Tensor make(int64_t n, Fn value_of) {
  Tensor t = Tensor::empty({n}, lr::dtype_v<T>);
  T* p = t.data_ptr<T>();
  for (int64_t i = 0; i < n; ++i) p[i] = from_int<T>(value_of(i));
  return t;
}

template <class T>
std::vector<double> read(const Tensor& t) {
  const T* p = static_cast<const T*>(t.raw_data());
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = to_double(p[i]);
  return out;
}

// A call in flight and what its result must be once it has completed.
struct Pending {
  std::shared_ptr<lc::Work> work;
  std::string what;
  std::function<std::vector<double>()> result;  // empty: nothing to compare
  std::vector<double> expected;
};

int64_t g_checks = 0;

// Waits for every call (they were all issued before the first wait, so
// several are in flight at once), then compares.
void finish(std::vector<Pending>& pending) {
  for (auto& p : pending) {
    try {
      p.work->wait();
    } catch (const std::exception& e) {
      fail(fmt::format("{}: {}", p.what, e.what()));
    }
    if (!p.work->is_completed()) fail(p.what + ": is_completed() is false after wait()");
    ++g_checks;
    if (!p.result) continue;
    const auto got = p.result();
    if (got.size() != p.expected.size()) {
      fail(fmt::format("{}: {} elements, expected {}", p.what, got.size(), p.expected.size()));
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != p.expected[i]) {
        fail(fmt::format("{}: element {} is {}, expected {}", p.what, i, got[i],
                         p.expected[i]));
      }
    }
    ++g_checks;
  }
  pending.clear();
}

// Avg of f16 values whose sum over the ranks leaves f16's range (65504):
// the mean, 40000 + 512 * (size - 1) (exact in f16), is what comes out.
void check_f16_average(lc::ProcessGroup& group) {
  const double want = 40000.0 + 512.0 * (g_size - 1);
  const int root = g_size - 1;
  Tensor a = make<lr::f16>(5, [](int64_t) { return 40000 + 1024 * g_rank; });
  group.allreduce(a, {.op = ReduceOp::Avg, .timeout = {}})->wait();
  Tensor r = make<lr::f16>(5, [](int64_t) { return 40000 + 1024 * g_rank; });
  group.reduce(r, {.op = ReduceOp::Avg, .root = root, .timeout = {}})->wait();
  Tensor in = make<lr::f16>(5 * g_size, [](int64_t) { return 40000 + 1024 * g_rank; });
  Tensor out = make<lr::f16>(5, [](int64_t) { return int64_t{-99}; });
  group.reduce_scatter(out, in, {.op = ReduceOp::Avg, .timeout = {}})->wait();
  const std::pair<const char*, Tensor> results[] = {
      {"allreduce", a}, {"reduce", r}, {"reduce_scatter", out}};
  for (const auto& [what, t] : results) {
    if (std::string_view(what) == "reduce" && g_rank != root) continue;
    for (double v : read<lr::f16>(t)) {
      if (v != want) fail(fmt::format("f16 Avg {}: {}, expected {}", what, v, want));
    }
    ++g_checks;
  }
}

// Max and Min give NaN wherever any rank holds one, whichever rank it is
// (torch.maximum's rule, as the other backends).
template <class T>
void check_nan_wins(lc::ProcessGroup& group) {
  for (int holder = 0; holder < g_size; ++holder) {
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
      Tensor t = make<T>(3, [](int64_t i) { return i + g_rank; });
      if (g_rank == holder) static_cast<T*>(t.raw_data())[1] = from_nan<T>();
      group.allreduce(t, {.op = op, .timeout = {}})->wait();
      const auto got = read<T>(t);
      if (!std::isnan(got[1]) || std::isnan(got[0]) || std::isnan(got[2])) {
        fail(fmt::format("{} {} with a NaN on rank {}: {}, {}, {}", to_string(op),
                         lr::dtype_name(lr::dtype_v<T>), holder, got[0], got[1], got[2]));
      }
      ++g_checks;
    }
  }
}

// Max of -0 and +0 is +0 and Min is -0, whichever rank holds which zero (as
// the other backends).
template <class T>
void check_signed_zero(lc::ProcessGroup& group) {
  for (int holder = 0; holder < g_size; ++holder) {
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
      Tensor t = Tensor::from_vector<double>({g_rank == holder ? -0.0 : 0.0}, {1})
                     .to(lr::dtype_v<T>);
      group.allreduce(t, {.op = op, .timeout = {}})->wait();
      const double got = read<T>(t)[0];
      if (got != 0.0 || std::signbit(got) != (op == ReduceOp::Min)) {
        fail(fmt::format("{} {} with -0 on rank {} and +0 on the others: {}", to_string(op),
                         lr::dtype_name(lr::dtype_v<T>), holder, got));
      }
      ++g_checks;
    }
  }
}

template <class T>
std::string label(std::string_view op, int64_t count, std::string_view extra = "") {
  return fmt::format("{} {} count {}{}{}", op, lr::dtype_name(lr::dtype_v<T>), count,
                     extra.empty() ? "" : " ", extra);
}

template <class T>
void check_dtype(lc::ProcessGroup& group) {
  const int rank = g_rank, size = g_size;
  std::vector<Pending> pending;

  // allreduce: every op and count in flight together.
  for (ReduceOp op : kOps) {
    for (int64_t n : kCounts) {
      Tensor t = make<T>(n, [&](int64_t i) { return input(op, rank, i); });
      std::vector<double> want;
      for (int64_t i = 0; i < n; ++i) want.push_back(expected_reduction<T>(op, i));
      pending.push_back({group.allreduce(t, {.op = op, .timeout = {}}),
                         label<T>("allreduce", n, to_string(op)), [t] { return read<T>(t); },
                         want});
    }
  }
  finish(pending);

  // broadcast from the last rank (not 0) and from 0; others start with junk.
  for (int root : {size - 1, 0}) {
    for (int64_t n : kCounts) {
      const auto value = [&](int64_t i) { return (i % 50) - 20 + root; };
      Tensor t = make<T>(n, [&](int64_t i) { return rank == root ? value(i) : int64_t{-99}; });
      std::vector<double> want;
      for (int64_t i = 0; i < n; ++i) want.push_back(to_double(from_int<T>(value(i))));
      pending.push_back({group.broadcast(t, {.root = root, .timeout = {}}),
                         label<T>("broadcast", n, fmt::format("root {}", root)),
                         [t] { return read<T>(t); }, want});
    }
  }
  finish(pending);

  // reduce to the last rank: only the root's tensor is specified.
  const int root = size - 1;
  for (ReduceOp op : kOps) {
    for (int64_t n : kCounts) {
      Tensor t = make<T>(n, [&](int64_t i) { return input(op, rank, i); });
      Pending p{group.reduce(t, {.op = op, .root = root, .timeout = {}}),
                label<T>("reduce", n, fmt::format("{} root {}", to_string(op), root)), {}, {}};
      if (rank == root) {
        for (int64_t i = 0; i < n; ++i) p.expected.push_back(expected_reduction<T>(op, i));
        p.result = [t] { return read<T>(t); };
      }
      pending.push_back(std::move(p));
    }
  }
  finish(pending);

  // allgather: rank r's chunk is r * 16 + (i % 16) - 8; then once in place.
  const auto chunk_value = [](int r, int64_t i) { return r * 16 + (i % 16) - 8; };
  for (int64_t n : kCounts) {
    Tensor in = make<T>(n, [&](int64_t i) { return chunk_value(rank, i); });
    Tensor out = make<T>(n * size, [](int64_t) { return int64_t{-99}; });
    std::vector<double> want;
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) want.push_back(to_double(from_int<T>(chunk_value(r, i))));
    }
    pending.push_back({group.allgather(out, in), label<T>("allgather", n),
                       [out] { return read<T>(out); }, want});
    if (n == 7) {
      Tensor whole = make<T>(n * size, [&](int64_t j) {
        return j / n == rank ? chunk_value(rank, j % n) : int64_t{-99};
      });
      Tensor mine = whole.slice(0, rank * n, (rank + 1) * n);
      pending.push_back({group.allgather(whole, mine), label<T>("allgather in place", n),
                         [whole] { return read<T>(whole); }, want});
    }
  }
  finish(pending);

  // reduce_scatter: rank r gets the reduction of chunk r of every input.
  for (ReduceOp op : kOps) {
    for (int64_t n : kCounts) {
      Tensor in = make<T>(n * size, [&](int64_t j) { return input(op, rank, j); });
      Tensor out = make<T>(n, [](int64_t) { return int64_t{-99}; });
      std::vector<double> want;
      for (int64_t i = 0; i < n; ++i) want.push_back(expected_reduction<T>(op, rank * n + i));
      pending.push_back({group.reduce_scatter(out, in, {.op = op, .timeout = {}}),
                         label<T>("reduce_scatter", n, to_string(op)),
                         [out] { return read<T>(out); }, want});
    }
  }
  finish(pending);

  // send/recv around the ring: every rank sends before it receives, so this
  // also needs both to be in flight at once.
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const auto ring_value = [](int src, int64_t i) { return src * 10 + (i % 10); };
  for (int64_t n : kCounts) {
    Tensor out = make<T>(n, [&](int64_t i) { return ring_value(rank, i); });
    Tensor in = make<T>(n, [](int64_t) { return int64_t{-99}; });
    std::vector<double> want;
    for (int64_t i = 0; i < n; ++i) want.push_back(to_double(from_int<T>(ring_value(prev, i))));
    pending.push_back(
        {group.send(out, next, {.tag = 5, .timeout = {}}), label<T>("send", n), {}, {}});
    pending.push_back({group.recv(in, prev, {.tag = 5, .timeout = {}}), label<T>("recv", n),
                       [in] { return read<T>(in); }, want});
  }
  finish(pending);
}

// Returns the error's message.
template <class Fn>
std::string expect_error(const std::string& what, Fn fn, const std::vector<std::string>& needles) {
  std::string message;
  try {
    fn();
  } catch (const std::exception& e) {
    message = e.what();
  }
  if (message.empty()) fail(what + ": no error was thrown");
  for (const auto& needle : needles) {
    if (message.find(needle) == std::string::npos) {
      fail(fmt::format("{}: the error does not mention '{}': {}", what, needle, message));
    }
  }
  ++g_checks;
  return message;
}

void check_misc(lc::ProcessGroup& group) {
  const int rank = g_rank, size = g_size;
  std::vector<Pending> pending;
  for (int i = 0; i < 3; ++i) pending.push_back({group.barrier(), "barrier", {}, {}});
  finish(pending);

  // A 4 MiB message around the ring: beyond MPI's eager limit, so it only
  // completes if the recv is posted while the send is in flight.
  const int64_t n = int64_t{1} << 20;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  Tensor out = make<int32_t>(n, [&](int64_t i) { return rank * 1000003 + i; });
  Tensor in = make<int32_t>(n, [](int64_t) { return int64_t{-1}; });
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i) want.push_back(static_cast<double>(prev * 1000003 + i));
  pending.push_back({group.send(out, next, {.tag = 9, .timeout = {}}), "send 4 MiB", {}, {}});
  pending.push_back({group.recv(in, prev, {.tag = 9, .timeout = {}}), "recv 4 MiB",
                     [in] { return read<int32_t>(in); }, want});
  finish(pending);

  // Refused before anything is sent (so the ranks stay in step).
  Tensor small = Tensor::zeros({3});
  Tensor wrong = Tensor::zeros({3 * size + 1});
  expect_error("allgather with a wrong output size", [&] { group.allgather(wrong, small); },
               {"allgather", "default"});
  expect_error("send to a rank outside the group", [&] { group.send(small, size); },
               {"send", "peer"});
  expect_error("u8 Avg", [&] {
    Tensor bytes = Tensor::zeros({3}, lr::DType::u8);
    group.allreduce(bytes, {.op = ReduceOp::Avg, .timeout = {}});
  }, {"u8", "Avg"});
}

// u8 and bool as PyTorch reduces them: u8 Sum and Product wrap modulo 256,
// bool Sum and Max are a logical or, Product and Min a logical and (MPI_C_BOOL
// takes only MPI_LOR and MPI_LAND). Rank r's element i is byte_value(r, i).
int byte_value(lr::DType dtype, int r, int64_t i) {
  if (dtype == lr::DType::boolean) return (r + i) % 3 == 0 || i % 5 == 0 ? 1 : 0;
  return static_cast<int>((200 + 37 * r + 11 * i) % 256);
}

void check_bytes(lc::ProcessGroup& group, lr::DType dtype) {
  const int64_t n = 37;
  const bool is_bool = dtype == lr::DType::boolean;
  const auto make_bytes = [&](int r) {
    Tensor t = Tensor::empty({n}, dtype);
    auto* p = static_cast<uint8_t*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(byte_value(dtype, r, i));
    return t;
  };
  const auto read_bytes = [](const Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.raw_data());
    return std::vector<double>(p, p + t.numel());
  };
  std::vector<Pending> pending;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max}) {
    std::vector<double> want;
    for (int64_t i = 0; i < n; ++i) {
      int acc = byte_value(dtype, 0, i);
      for (int r = 1; r < g_size; ++r) {
        const int v = byte_value(dtype, r, i);
        if (op == ReduceOp::Sum) acc = is_bool ? (acc | v) : (acc + v) % 256;
        if (op == ReduceOp::Product) acc = is_bool ? (acc & v) : (acc * v) % 256;
        if (op == ReduceOp::Min) acc = std::min(acc, v);
        if (op == ReduceOp::Max) acc = std::max(acc, v);
      }
      want.push_back(acc);
    }
    Tensor t = make_bytes(g_rank);
    pending.push_back({group.allreduce(t, {.op = op, .timeout = {}}),
                       fmt::format("allreduce {} {}", lr::dtype_name(dtype), to_string(op)),
                       [t, read_bytes] { return read_bytes(t); }, want});
  }
  const int root = g_size - 1;
  Tensor b = make_bytes(g_rank);
  pending.push_back({group.broadcast(b, {.root = root, .timeout = {}}),
                     fmt::format("broadcast {}", lr::dtype_name(dtype)),
                     [b, read_bytes] { return read_bytes(b); }, read_bytes(make_bytes(root))});
  Tensor gathered = Tensor::zeros({n * g_size}, dtype);
  std::vector<double> all;
  for (int r = 0; r < g_size; ++r) {
    for (double v : read_bytes(make_bytes(r))) all.push_back(v);
  }
  pending.push_back({group.allgather(gathered, make_bytes(g_rank)),
                     fmt::format("allgather {}", lr::dtype_name(dtype)),
                     [gathered, read_bytes] { return read_bytes(gathered); }, all});
  finish(pending);
}

// A send and recv of different dtypes or sizes fail the recv with what was
// sent, even when the bytes agree (MPI itself compares only their number);
// the group stays usable. A longer message than the tensor aborts the group
// (MPI fails the recv), so it comes last.
void check_p2p_mismatch(lc::ProcessGroup& group, bool longer_too) {
  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  const std::string sender = fmt::format("rank {} sent", prev);
  auto pair = [&](const Tensor& out, Tensor in) {
    auto sent = group.send(out, next, {.tag = 4, .timeout = {}});
    auto got = group.recv(in, prev, {.tag = 4, .timeout = {}});
    sent->wait();
    got->wait();
  };
  expect_error("f32 sent, i32 received", [&] {
    pair(Tensor::full({5}, 1.0), Tensor::zeros({5}, lr::DType::i32));
  }, {sender, "5 elements of f32", "5 of i32", "same size and dtype"});
  expect_error("2 elements sent, 3 received", [&] {
    pair(Tensor::full({2}, 1.0), Tensor::zeros({3}));
  }, {sender, "2 elements of f32", "3 of f32"});
  std::vector<Pending> pending;
  for (int i = 0; i < 2; ++i) pending.push_back({group.barrier(), "barrier", {}, {}});
  finish(pending);
  if (!longer_too) return;
  expect_error("4 elements sent, 3 received", [&] {
    pair(Tensor::full({4}, 1.0), Tensor::zeros({3}));
  }, {sender, "4 elements of f32", "3 of f32"});
}

void check_timeout(lc::ProcessGroup& group) {
  if (g_rank != 0) return;  // the others never join: rank 0's barrier times out
  auto work = group.barrier({.timeout = std::chrono::milliseconds(300)});
  const auto message =
      expect_error("barrier that nobody else joins", [&] { work->wait(); },
                   {"barrier", "timed out", "rank 0", "group 'default'", "stop the job"});
  Tensor t = Tensor::zeros({3});
  expect_error("allreduce after the timeout", [&] { group.allreduce(t); },
               {"allreduce", "aborted", "timed out"});
  fmt::print("mpi_collective_worker rank {}/{}: timeout case OK: {}\n", g_rank, g_size, message);
  std::fflush(stdout);
}

// A recv whose peer sends nothing names that peer and the tag, as gloo's
// does, and why a send may not have started: before, it said that "some
// rank did not join this collective".
void check_p2p_timeout(lc::ProcessGroup& group) {
  if (g_rank != 0) return;  // rank 1 sends nothing
  Tensor t = Tensor::zeros({3});
  auto work = group.recv(t, 1, {.tag = 8, .timeout = std::chrono::milliseconds(300)});
  const auto message = expect_error(
      "recv that rank 1 never matches", [&] { work->wait(); },
      {"recv (f32, 3 elements, from rank 1, tag 8) timed out", "rank 0 of group 'default'",
       "rank 1 sent nothing to match it in time (a send to this rank with tag 8",
       "starts only once the collectives issued before it"});
  if (message.find("did not join this collective") != std::string::npos) {
    fail("a recv's timeout speaks of a collective: " + message);
  }
  fmt::print("mpi_collective_worker rank {}/{}: p2p timeout case OK: {}\n", g_rank, g_size,
             message);
  std::fflush(stdout);
}

// new_group over an mpi group of the whole job: {1, 3} (the job's odd ranks)
// sums among its members only; the others get nullptr.
void check_new_group(long timeout_ms) {
  auto world = lc::init_process_group(
      {.backend = "mpi", .timeout = std::chrono::milliseconds(timeout_ms)});
  g_rank = world->rank();
  g_size = world->size();
  auto odd = lc::new_group(*world, {1, 3});
  if ((odd != nullptr) != (g_rank % 2 == 1)) fail("new_group: membership is wrong");
  if (odd) {
    if (odd->backend() != "mpi" || odd->size() != 2 || odd->rank() != g_rank / 2)
      fail(fmt::format("new_group: {} rank {} of {}", odd->backend(), odd->rank(), odd->size()));
    Tensor t = Tensor::full({4}, static_cast<double>(g_rank), lr::DType::f32);
    odd->allreduce(t)->wait();
    if (t.to_vector<float>() != std::vector<float>(4, 4.0f))
      fail(fmt::format("new_group: allreduce over ranks 1 and 3 gave {}", t.to_vector<float>()[0]));
  }
  world->barrier()->wait();
  fmt::print("mpi_collective_worker rank {}/{}: new_group case OK\n", g_rank, g_size);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int die_at_rank = -1;
  bool timeout_case = false;
  bool p2p_timeout_case = false;
  long timeout_ms = 60000;
  int diverge_at_rank = -1;
  bool new_group_case = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--die-at-rank" && i + 1 < argc) {
      die_at_rank = std::atoi(argv[++i]);
    } else if (arg == "--timeout-ms" && i + 1 < argc) {
      timeout_ms = std::atol(argv[++i]);
    } else if (arg == "--timeout-case") {
      timeout_case = true;
    } else if (arg == "--p2p-timeout-case") {
      p2p_timeout_case = true;
    } else if (arg == "--new-group-case") {
      new_group_case = true;
    } else if (arg == "--diverge-at-rank" && i + 1 < argc) {
      diverge_at_rank = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--die-at-rank R] [--timeout-case] [--p2p-timeout-case] "
                   "[--timeout-ms T] [--diverge-at-rank R] [--new-group-case]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    if (new_group_case) {
      check_new_group(timeout_ms);
      return 0;
    }
    lc::mpi::ensure_mpi_initialized();
    g_rank = lc::mpi::world_rank();
    g_size = lc::mpi::world_size();
    auto group = lc::make_mpi_group(g_rank, g_size, "default",
                                    std::chrono::milliseconds(timeout_ms));
    if (g_rank == die_at_rank) {
      fmt::print("mpi_collective_worker rank {}/{}: exiting with code 3 (--die-at-rank)\n",
                 g_rank, g_size);
      std::fflush(stdout);
      std::_Exit(3);  // like a crash: no MPI_Finalize
    }
    if (diverge_at_rank >= 0) {
      Tensor t = g_rank == diverge_at_rank ? Tensor::zeros({2}, lr::DType::i64) : Tensor::zeros({1000});
      group->allreduce(t)->wait();
      fail("the mismatched allreduce returned without an error");
    }
    check_dtype<float>(*group);
    check_dtype<double>(*group);
    check_dtype<lr::bf16>(*group);
    check_dtype<lr::f16>(*group);
    check_dtype<int32_t>(*group);
    check_dtype<int64_t>(*group);
    check_f16_average(*group);
    check_nan_wins<float>(*group);
    check_nan_wins<double>(*group);
    check_nan_wins<lr::bf16>(*group);
    check_nan_wins<lr::f16>(*group);
    check_signed_zero<float>(*group);
    check_signed_zero<double>(*group);
    check_signed_zero<lr::bf16>(*group);
    check_bytes(*group, lr::DType::u8);
    check_bytes(*group, lr::DType::boolean);
    check_misc(*group);
    // The string every rank gets is the root's.
    const std::string word = lc::mpi::broadcast_string(
        g_rank == g_size - 1 ? "from the last rank" : "not this one", g_size - 1);
    if (word != "from the last rank") fail("broadcast_string gave '" + word + "'");
    ++g_checks;
    check_p2p_mismatch(*group, /*longer_too=*/!timeout_case && !p2p_timeout_case);
    if (timeout_case) check_timeout(*group);
    if (p2p_timeout_case) check_p2p_timeout(*group);
    fmt::print("mpi_collective_worker rank {}/{}: OK ({} checks)\n", g_rank, g_size, g_checks);
    std::fflush(stdout);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
}

#else  // built without MPI: nothing to run

#include <cstdio>

int main() {
  std::fprintf(stderr, "mpi_collective_worker: lockstep was built without MPI\n");
  return 2;
}

#endif
