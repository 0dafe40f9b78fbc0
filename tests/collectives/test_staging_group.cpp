// collectives/cuda_staging: CUDA tensors through the CPU backends (built with
// CUDA only). Without a GPU: the host tensor pool, and CPU tensors passing
// straight through. With one ([gpu]): every collective of CUDA tensors over
// shm and gloo at 2 ranks (threads over a MemoryStore) gives the exact CPU
// results, and 2 processes sharing one GPU run every collective through
// lockstep-run; a result copied back on a stream other than its memory's
// keeps that memory from reuse until the copy is done.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_CUDA

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/cuda_staging/host_tensor_pool.h"
#include "lockstep/collectives/cuda_staging/staging_group.h"
#include "lockstep/runtime/cuda/stream.h"
#include "gpu/stream_gate.h"
#include "support/gpu_skip.h"
#include "support/subprocess.h"

namespace lc = lockstep::collectives;
namespace lr = lockstep::runtime;
namespace lt = lockstep::testing;
using lr::Device;
using lr::DType;
using lr::Tensor;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

using Groups = std::vector<std::shared_ptr<lc::ProcessGroup>>;

// Every collective of `g` on tensors on `device`, each result checked exactly
// (collective_check.h). Sends and recvs where gloo carries them (shm's go
// through gloo).
void check_every_collective(lc::ProcessGroup& g, std::vector<std::string>& failures,
                            const Device& device) {
  const int r = g.rank(), size = g.size();
  const auto in = [&](int rank, int64_t n, DType dtype) {
    return lt::input(rank, n, dtype).to(device);
  };
  for (DType dtype : lt::kDTypes) {
    const auto dt = lr::dtype_name(dtype);
    for (int64_t n : lt::kCounts) {
      for (lc::ReduceOp op : lt::kOps) {
        const auto what = [&](std::string_view c) {
          return fmt::format("{} {} {} n={}", c, dt, lc::to_string(op), n);
        };
        Tensor a = in(r, n, dtype);
        g.allreduce(a, {.op = op, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(a, [&](int64_t i) {
          return lt::expected_value(op, dtype, size, i);
        }, what("allreduce")));
        Tensor chunk = Tensor::zeros({n}, dtype, device);
        g.reduce_scatter(chunk, in(r, n * size, dtype), {.op = op, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(chunk, [&](int64_t i) {
          // Rank q's chunk r is elements r*n .. of lt::input(q, n * size).
          return lt::expected_value(op, dtype, size, r * n + i);
        }, what("reduce_scatter")));
      }
      for (int root = 0; root < size; ++root) {
        Tensor b = in(r, n, dtype);
        g.broadcast(b, {.root = root, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(b, [&](int64_t i) {
          return double(lt::input_value(root, i));
        }, fmt::format("broadcast {} n={} root {}", dt, n, root)));
        Tensor s = in(r, n, dtype);
        g.reduce(s, {.op = lc::ReduceOp::Sum, .root = root, .timeout = {}})->wait();
        if (r == root) {
          lt::add_failure(failures, lt::mismatch(s, [&](int64_t i) {
            return lt::expected_value(lc::ReduceOp::Sum, dtype, size, i);
          }, fmt::format("reduce {} n={} root {}", dt, n, root)));
        }
      }
      Tensor gathered = Tensor::zeros({n * size}, dtype, device);
      g.allgather(gathered, in(r, n, dtype), {.timeout = {}})->wait();
      lt::add_failure(failures, lt::mismatch(gathered, [&](int64_t i) {
        return double(lt::input_value(static_cast<int>(i / n), i % n));
      }, fmt::format("allgather {} n={}", dt, n)));
    }
    if (!lc::is_built_in("gloo")) continue;
    const int next = (r + 1) % size, prev = (r + size - 1) % size;
    Tensor sent = in(r, 1001, dtype);
    Tensor received = Tensor::zeros({1001}, dtype, device);
    auto send = g.send(sent, next, {.tag = 3, .timeout = {}});
    g.recv(received, prev, {.tag = 3, .timeout = {}})->wait();
    send->wait();
    lt::add_failure(failures, lt::mismatch(received, [&](int64_t i) {
      return double(lt::input_value(prev, i));
    }, fmt::format("recv {} from rank {}", dt, prev)));
  }
  g.barrier({.timeout = {}})->wait();
}

}  // namespace

TEST_CASE("host tensor pool: reuses a tensor nothing else holds, within its cap",
          "[collectives][staging]") {
  lc::HostTensorPool pool(1000);
  Tensor a = pool.take(DType::f32, 100);
  CHECK(a.device().is_cpu());
  CHECK(a.dtype() == DType::f32);
  CHECK(a.shape() == lr::Shape{100});
  void* const memory = a.raw_data();
  pool.give_back(a);
  CHECK(pool.take(DType::f32, 100).raw_data() != memory);  // `a` still holds it
  a = Tensor();
  CHECK(pool.take(DType::i32, 100).raw_data() != memory);  // another dtype
  CHECK(pool.take(DType::f32, 99).raw_data() != memory);   // another size
  Tensor again = pool.take(DType::f32, 100);
  CHECK(again.raw_data() == memory);
  CHECK(pool.cached_bytes() == 0);

  pool.give_back(Tensor::empty({600}));  // 2400 bytes: more than the cap, not kept
  CHECK(pool.cached_bytes() == 0);
  for (int k = 0; k < 3; ++k) pool.give_back(Tensor::empty({100}));  // 400 bytes each
  CHECK(pool.cached_bytes() == 800);  // the oldest went
}

TEST_CASE("staging group: CPU tensors go straight through", "[collectives][staging]") {
  const Groups inner = lt::make_groups("shm", 2, "staging-cpu");
  Groups groups;
  for (const auto& g : inner) groups.push_back(lc::make_cuda_staging_group(g));
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    if (g.backend() != "shm") failures.push_back("backend() is " + g.backend());
    check_every_collective(g, failures, Device::cpu());
  });
}

TEST_CASE("staging group: CUDA tensors over a CPU backend give the exact CPU results",
          "[gpu][collectives][staging]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (!lc::is_built_in(backend)) return;
  INFO(backend);
  // make_process_group wraps every CPU backend in the staging group.
  const Groups groups = lt::make_groups(backend, 2, "staging-cuda-" + backend);
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    check_every_collective(g, failures, Device::cuda(0));
  });
}

TEST_CASE("staging group: a copy back on another stream keeps the memory until it is done",
          "[gpu][collectives][staging]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (!lc::is_built_in(backend)) return;
  INFO(backend);
  const Groups groups = lt::make_groups(backend, 1, "staging-stream-" + backend);
  const lr::cuda::StreamView allocation_stream = lr::cuda::current_stream(0);
  Tensor t = Tensor::ones({1 << 16}, DType::f32, Device::cuda(0));  // for allocation_stream
  void* const block = t.storage()->data();
  lr::cuda::synchronize(allocation_stream);
  // Issued on allocation_stream (the copy in is waited for), copied back on
  // `other`, where it waits behind the gate.
  auto work = groups[0]->allreduce(t, {.timeout = {}});
  lr::cuda::Stream other(0);
  lt::StreamGate gate(other);
  {
    lr::cuda::StreamGuard on_other(other);
    work->wait();
  }
  t = Tensor();  // dropped before the copy into it has run
  Tensor next = Tensor::empty({1 << 16}, DType::f32, Device::cuda(0));  // allocation_stream
  CHECK(next.storage()->data() != block);  // not handed out while `other` may still write it
  gate.release();
  other.synchronize();
}

TEST_CASE("staging group: 2 processes sharing one GPU, every collective through lockstep-run",
          "[gpu][collectives][staging]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (!lc::is_built_in(backend)) return;
  const auto result = lt::run_process({lt::bin_path("lockstep-run"), "-np", "2", "--tag-output",
                                       lt::bin_path("collective_worker"), "--backend", backend,
                                       "--device", "cuda"},
                                      240s, {"LOCKSTEP_TIMEOUT_S=60"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(result.output,
               Contains(fmt::format("collective_worker rank {}/2: backend {}", r, backend)));
    CHECK_THAT(result.output, Contains(fmt::format("collective_worker rank {}/2: OK (", r)));
  }
}

#endif  // LOCKSTEP_HAVE_CUDA
