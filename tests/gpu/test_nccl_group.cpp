// The nccl backend. [gpu] tests run on a CUDA device (skipped without one):
// every collective, dtype, op and count at world size 1 with exact values, in
// this process over a MemoryStore and through lockstep-run; the ordering of
// the communication stream against the caller's; the watchdog's timeout; a
// creation whose peer never comes; with 2 GPUs, a group on cuda:1 that makes
// no context on cuda:0, and init_process_group's communicators on the devices
// the ranks name.
// Without a GPU, asking for nccl must still fail with a clear message; with
// one, CPU tensors are staged through the device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "lockstep/collectives/init.h"
#include "lockstep/config.h"
#include "lockstep/distributed/store/memory_store.h"
#include "support/gpu_skip.h"
#include "support/subprocess.h"
#include "support/test_util.h"

#if LOCKSTEP_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "lockstep/collectives/nccl/nccl_group.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/stream.h"
#include "gpu/stream_gate.h"
#endif

namespace lc = lockstep::collectives;
namespace lr = lockstep::runtime;
namespace lt = lockstep::testing;
using lr::Device;
using lr::DType;
using lr::Tensor;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

TEST_CASE("nccl refuses clearly where it cannot serve", "[collectives][nccl]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const auto make = [&] {
    return lc::make_process_group("nccl", store, 0, 1, "nccl-refused", 10s);
  };
  if (!LOCKSTEP_HAVE_NCCL) {
    CHECK_THROWS_WITH(make(), Contains("not built into") && Contains("LOCKSTEP_NCCL"));
    return;
  }
  if (!lt::gpu_skip_reason().empty()) {  // built in, but no GPU here
    CHECK_THROWS_WITH(make(), Contains("needs a CUDA device") && Contains("gloo or shm"));
    return;
  }
  // CPU tensors are staged through the device, and wait() leaves the results
  // in host memory (DDP's and the checkpoints' control tensors take this path).
  auto group = make();
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  group->allreduce(t)->wait();
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor gathered = Tensor::zeros({4});
  group->allgather(gathered, t)->wait();
  CHECK(gathered.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor scattered = Tensor::zeros({4});
  group->reduce_scatter(scattered, t)->wait();
  CHECK(scattered.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor on_device = Tensor::zeros({4}).to(Device::cuda(0));
  group->allgather(on_device, t)->wait();  // a CPU input into a CUDA output
  CHECK(on_device.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor flags = Tensor::from_vector<uint8_t>({1}, {1});
  CHECK_THROWS_WITH(group->broadcast(flags), Contains("dtype"));
}

#if LOCKSTEP_HAVE_NCCL
namespace {

using lt::StreamGate;

std::shared_ptr<lc::NcclGroup> solo_group(
    const std::string& name,
    lc::AsyncErrorHandling async_errors = lc::AsyncErrorHandling::end_process) {
  return lc::make_nccl_group(std::make_shared<lockstep::distributed::MemoryStore>(), 0, 1, name, 60s,
                             {.async_errors = async_errors});
}

// An all-reduce with a 300 ms timeout behind a gated current stream (it cannot
// start); returns once the watchdog has failed it, or after 20 s.
std::shared_ptr<lc::Work> timed_out_allreduce(lc::NcclGroup& g, Tensor& t) {
  auto work = g.allreduce(t, {.op = lc::ReduceOp::Sum, .timeout = 300ms});
  work->wait();  // nothing reported yet: the host is not blocked
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (!work->is_completed() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(5ms);
  }
  return work;
}

}  // namespace

TEST_CASE("nccl at world size 1: every collective, dtype, op and count, exact",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto g = solo_group("nccl-solo");
  const Device cuda = Device::cuda(g->device());
  const auto on_gpu = [&](int64_t n, DType dtype) { return lt::input(0, n, dtype).to(cuda); };
  std::vector<std::string> failures;
  for (DType dtype : lt::kDTypes) {
    const auto dt = lr::dtype_name(dtype);
    for (int64_t n : lt::kCounts) {
      const auto same = [&](int64_t i) { return double(lt::input_value(0, i)); };
      for (lc::ReduceOp op : lt::kOps) {
        const auto reduced = [&](int64_t i) { return lt::expected_value(op, dtype, 1, i); };
        const auto what = [&](std::string_view c) {
          return fmt::format("{} {} {} n={}", c, dt, lc::to_string(op), n);
        };
        Tensor a = on_gpu(n, dtype);
        g->allreduce(a, {.op = op, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(a, reduced, what("allreduce")));
        Tensor r = on_gpu(n, dtype);
        g->reduce(r, {.op = op, .root = 0, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(r, reduced, what("reduce")));
        Tensor chunk = Tensor::zeros({n}, dtype, cuda);
        g->reduce_scatter(chunk, on_gpu(n, dtype), {.op = op, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(chunk, reduced, what("reduce_scatter")));
      }
      Tensor b = on_gpu(n, dtype);
      g->broadcast(b, {.root = 0, .timeout = {}})->wait();
      lt::add_failure(failures, lt::mismatch(b, same, fmt::format("broadcast {} n={}", dt, n)));
      Tensor gathered = Tensor::zeros({n}, dtype, cuda);
      g->allgather(gathered, on_gpu(n, dtype), {.timeout = {}})->wait();
      lt::add_failure(failures,
                      lt::mismatch(gathered, same, fmt::format("allgather {} n={}", dt, n)));
    }
  }
  // Several dtypes and sizes in one ncclGroupStart/End.
  std::vector<Tensor> bucket;
  for (DType dtype : lt::kDTypes) bucket.push_back(on_gpu(1001, dtype));
  bucket.push_back(on_gpu(0, DType::f32));
  g->allreduce_coalesced(bucket, {.op = lc::ReduceOp::Max, .timeout = {}})->wait();
  for (const Tensor& t : bucket) {
    const auto same = [](int64_t i) { return double(lt::input_value(0, i)); };
    lt::add_failure(failures, lt::mismatch(t, same, fmt::format("allreduce_coalesced {}",
                                                                lr::dtype_name(t.dtype()))));
  }
  auto barrier = g->barrier();
  barrier->wait();
  CHECK(barrier->is_completed());  // a barrier's wait() blocks the host
  INFO((failures.empty() ? std::string() : failures.front()));
  CHECK(failures.empty());
}

TEST_CASE("nccl: the collective follows the caller's stream, and wait() does not block the host",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto g = solo_group("nccl-order");
  lr::cuda::Stream compute(g->device());
  lr::cuda::StreamGuard current(compute);
  Tensor t = Tensor::zeros({1024}, DType::i32, Device::cuda(g->device()));
  StreamGate gate(compute);
  // Queued behind the gate on the caller's stream: the all-reduce must see it.
  LOCKSTEP_CUDA_CHECK(
      cudaMemsetAsync(t.raw_data(), 0x01, 1024 * sizeof(int32_t), compute.handle()));
  auto work = g->allreduce(t, {.op = lc::ReduceOp::Sum, .timeout = {}});
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(work->is_completed());  // the communication stream waits for `compute`
  work->wait();                       // returns with `compute` still held
  CHECK_FALSE(work->is_completed());
  gate.release();
  compute.synchronize();  // ordered after the all-reduce by wait()
  CHECK(work->is_completed());
  const auto v = t.to_vector<int32_t>();
  CHECK(std::all_of(v.begin(), v.end(), [](int32_t x) { return x == 0x01010101; }));
}

TEST_CASE("nccl: a collective past its timeout is aborted by the watchdog, naming op and rank",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  // fail-works: the process goes on, so this test can look at the Work.
  auto g = solo_group("nccl-timeout", lc::AsyncErrorHandling::fail_works);
  lr::cuda::Stream compute(g->device());
  lr::cuda::StreamGuard current(compute);
  Tensor t = Tensor::zeros({16}, DType::f32, Device::cuda(g->device()));
  compute.synchronize();
  StreamGate gate(compute);  // the all-reduce cannot start: it times out
  auto work = timed_out_allreduce(*g, t);
  REQUIRE(work->is_completed());
  const std::string message = lt::message_of(work->exception());
  CHECK_THAT(message, Contains("allreduce #1 (f32, 16 elements, sum) timed out after 0.3 s") &&
                          Contains("rank 0 of group 'nccl-timeout' (nccl, 1 ranks)") &&
                          Contains("communicator was aborted"));
  CHECK_THROWS_WITH(work->wait(), Contains("timed out"));
  gate.release();  // the watchdog fails the Works before it aborts, which may wait for this
  CHECK_THROWS_WITH(g->allreduce(t),
                    Contains("unusable because allreduce #1 (f32, 16 elements, sum) timed out"));
  CHECK_THROWS_WITH(g->barrier(), Contains("unusable"));
}

// "yes" or "no": whether `ordinal`'s primary context is active in this
// process, from the driver (the runtime cannot ask without making one).
std::string primary_context_active(int ordinal) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return "unknown (no libcuda.so.1)";
  using DeviceGet = int (*)(int*, int);
  using ContextState = int (*)(int, unsigned*, int*);
  const auto get = reinterpret_cast<DeviceGet>(dlsym(driver, "cuDeviceGet"));
  const auto state = reinterpret_cast<ContextState>(dlsym(driver, "cuDevicePrimaryCtxGetState"));
  int device = 0;
  unsigned flags = 0;
  int active = 0;
  if (get == nullptr || state == nullptr || get(&device, ordinal) != 0 ||
      state(device, &flags, &active) != 0)
    return "unknown (the driver did not say)";
  return active != 0 ? "yes" : "no";
}

// Run by the test after it in a process of its own, which must not have used
// cuda:0 before: a rank whose device is cuda:1 (select_device() makes it the
// current one) issues collectives while the watchdog polls them.
TEST_CASE("nccl probe: a group on cuda:1", "[.][nccl-device-probe]") {
  LOCKSTEP_SKIP_UNLESS_GPUS(2);
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(1));
  const std::string before = primary_context_active(0);
  auto g = solo_group("nccl-device-probe");
  REQUIRE(g->device() == 1);
  Tensor t = Tensor::ones({1024}, DType::f32, Device::cuda(1));
  for (int i = 0; i < 3; ++i) g->allreduce(t)->wait();
  auto barrier = g->barrier();
  barrier->wait();
  std::this_thread::sleep_for(300ms);  // the watchdog polls on meanwhile
  std::printf("nccl device probe: cuda:0 context before: %s, after: %s\n", before.c_str(),
              primary_context_active(0).c_str());
  std::fflush(stdout);
}

TEST_CASE("nccl: a group on cuda:1 makes no context on cuda:0, on no thread",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPUS(2);
  // The watchdog thread's current device was device 0, a new thread's: its
  // event queries made a context there, hundreds of MiB on GPU 0 per rank.
  const auto result =
      lt::run_process({lt::bin_path("lockstep_tests"), "[nccl-device-probe]"}, 120s);
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  CHECK_THAT(result.output, Contains("nccl device probe: cuda:0 context before: no, after: no"));
}

// Run by the next test in a process of its own: under the default handling
// the watchdog ends the process, so this never gets past the wait.
TEST_CASE("nccl probe: a timed-out all-reduce under the default handling",
          "[.][nccl-end-process-probe]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto g = solo_group("nccl-probe");
  lr::cuda::Stream compute(g->device());
  lr::cuda::StreamGuard current(compute);
  Tensor t = Tensor::zeros({16}, DType::f32, Device::cuda(g->device()));
  compute.synchronize();
  StreamGate gate(compute);
  timed_out_allreduce(*g, t);
  std::printf("nccl probe: still running\n");
  std::fflush(stdout);
}

TEST_CASE("nccl: by default a watchdog timeout ends the process, and lockstep-run names the rank",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const auto result = lt::run_process({lt::bin_path("lockstep-run"), "-np", "1",
                                       lt::bin_path("lockstep_tests"),
                                       "[nccl-end-process-probe]"},
                                      60s);
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.exit_code == 1);
  CHECK_FALSE(result.timed_out);
  CHECK_THAT(result.output,
             Contains("lockstep: rank 0 of group 'nccl-probe' (nccl, 1 ranks): allreduce #1 (f32, "
                      "16 elements, sum) timed out after 0.3 s") &&
                 Contains("this process ends now") && Contains("rank 0") &&
                 Contains("exited with code 1"));
  CHECK_THAT(result.output, !Contains("nccl probe: still running"));
}

TEST_CASE("nccl: a rank whose peer never comes fails its creation after the timeout",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  // Rank 0 of 2 publishes the unique id and waits in NCCL for rank 1, which
  // is never started: creation must end with an error, not hang.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  CHECK_THROWS_WITH(lc::make_process_group("nccl", store, 0, 2, "nccl-lonely", 2s),
                    Contains("rank 0 of 2 could not create its communicator") &&
                        Contains("did not connect the 2 ranks within 2 s"));
}

TEST_CASE("init_process_group makes each rank's nccl communicator on the device it names",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPUS(2);
  // Ranks as threads that name their device but never make it current (no
  // select_device()): a new thread's current device is cuda:0, where both
  // communicators went before, and NCCL refused two ranks on one GPU.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  constexpr int kRanks = 2;
  std::string backends[kRanks], errors[kRanks];
  std::vector<float> sums[kRanks];
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      lockstep::distributed::RankInfo info;
      info.rank = info.local_rank = r;
      info.world_size = info.local_world_size = kRanks;
      try {
        auto group = lc::init_process_group({.timeout = 60s, .name = "nccl-named-devices",
                                             .device = Device::cuda(r), .rank_info = info,
                                             .store = store});
        backends[r] = group->backend();
        Tensor t = Tensor::ones({256}, DType::f32, Device::cuda(r));
        group->allreduce(t)->wait();
        sums[r] = t.to_vector<float>();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
    CHECK(backends[r] == "nccl");
    CHECK(sums[r] == std::vector<float>(256, 2.0f));
  }
}

TEST_CASE("nccl at world size 1 through lockstep-run: every collective and dtype",
          "[gpu][collectives][nccl]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const auto result = lt::run_process({lt::bin_path("lockstep-run"), "-np", "1", "--tag-output",
                                       lt::bin_path("collective_worker"), "--backend", "nccl",
                                       "--device", "cuda"},
                                      180s, {"LOCKSTEP_TIMEOUT_S=60"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  CHECK_THAT(result.output, Contains("collective_worker rank 0/1: backend nccl"));
  CHECK_THAT(result.output, Contains("collective_worker rank 0/1: OK ("));
}
#endif  // LOCKSTEP_HAVE_NCCL
