// DDP's gradient promises, in-process over gloo (and shm where the buckets'
// memory matters): averaged (not summed) gradients equal to one process on
// the whole batch, compression hooks, a failed backward, gradient_as_bucket_view,
// buckets in shared memory, overlap. no_sync() is in test_ddp_no_sync.cpp.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"
#include "support/backend_skip.h"

namespace lt = lockstep::testing;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

namespace {

// Float sums in a different order (per-rank means, then the all-reduce)
// differ from the one-process mean in the last bits: 1e-5 relative.
constexpr double kTol = 1e-5;

std::vector<Tensor> reference_grads(const lt::Batch& global, uint64_t seed, int64_t hidden = 16) {
  auto model = lt::small_mlp(seed, 12, hidden);
  lt::loss_of(*model, global).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
  return grads;
}

// Runs one DDP backward per rank on its shard and compares with `expected`.
std::string check_ddp_grads(int rank, int size, const std::shared_ptr<lockstep::collectives::ProcessGroup>& group,
                            const lt::Batch& global, const std::vector<Tensor>& expected,
                            DdpOptions options, const lockstep::nn::CommHook& hook, double tol) {
  // Every rank starts from a different model: DDP must broadcast rank 0's.
  auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(rank == 0 ? 1 : 100 + rank),
                                                       group, options);
  if (hook) ddp->register_comm_hook(hook);
  lt::loss_of(*ddp, lt::shard(global, rank, size)).backward();
  return lt::grads_mismatch(ddp->module(), expected, tol);
}

}  // namespace

TEST_CASE("DDP: the averaged gradient equals one process's on the concatenated batch",
          "[ddp]") {
  const int size = GENERATE(2, 4);
  CAPTURE(size);
  const auto global = lt::global_batch(8 * size, 7);
  const auto expected = reference_grads(global, 1);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) {
    return check_ddp_grads(r, size, group, global, expected, {}, nullptr, kTol);
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: options that change how, not what: small buckets, bucket views", "[ddp]") {
  const int size = 2;
  const auto global = lt::global_batch(16, 8);
  const auto expected = reference_grads(global, 1);
  DdpOptions options;
  SECTION("many small buckets") {
    options.bucket_cap_mb = 0.0005;  // ~500 bytes: each bucket holds one or two parameters
    options.first_bucket_cap_mb = 0.0001;
  }
  SECTION("gradient_as_bucket_view") { options.gradient_as_bucket_view = true; }
  const auto problems = lt::on_ranks(size, [&](int r, auto group) {
    return check_ddp_grads(r, size, group, global, expected, options, nullptr, kTol);
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP averages the gradients register_hook hooks on its parameters return", "[ddp]") {
  // As PyTorch: a tensor hook on a parameter runs before accumulation, so the
  // reducer all-reduces the hooked gradient: twice each, twice the average.
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  auto expected = reference_grads(global, 1);
  for (Tensor& g : expected) g = lockstep::runtime::mul(g, Tensor::scalar(2));
  DdpOptions options;
  SECTION("own buckets") {}
  SECTION("gradient_as_bucket_view") { options.gradient_as_bucket_view = true; }
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(1), group, options);
    for (Tensor p : ddp->module().parameters()) {
      p.register_hook([](const Tensor& g) { return lockstep::runtime::mul(g, Tensor::scalar(2)); });
    }
    lt::loss_of(*ddp, lt::shard(global, r, size)).backward();
    return lt::grads_mismatch(ddp->module(), expected, kTol);
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP over shm: buckets in the group's shared pool give the bits of ordinary ones",
          "[ddp]") {
  const int size = GENERATE(2, 3);
  // Per bucket placement, per rank: every gradient of two iterations, in order.
  std::vector<std::vector<std::vector<float>>> seen(2, std::vector<std::vector<float>>(size));
  for (const bool shared : {true, false}) {
    const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
      auto ddp = std::make_shared<DistributedDataParallel>(
          lt::small_mlp(1, 12, 128), group, DdpOptions{.buckets_in_shared_memory = shared});
      for (const auto& bucket : ddp->buckets()) {
        if (bucket.in_shared_memory != shared) return "a bucket placed against the option";
      }
      auto& out = seen[shared ? 0 : 1][static_cast<size_t>(r)];
      for (uint64_t seed : {51, 52}) {
        lt::loss_of(*ddp, lt::shard(lt::global_batch(6 * size, seed), r, size)).backward();
        for (const Tensor& p : ddp->module().parameters()) {
          const auto g = p.grad().to_vector<float>();
          out.insert(out.end(), g.begin(), g.end());
          Tensor(p).set_grad(Tensor{});
        }
      }
      return "";
    }, "ddp-pool", "shm");
    INFO(lt::joined(problems));
    REQUIRE(lt::joined(problems).empty());
  }
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    CHECK(seen[0][static_cast<size_t>(r)] == seen[1][static_cast<size_t>(r)]);
    CHECK(seen[0][static_cast<size_t>(r)] == seen[0][0]);
  }
}

TEST_CASE("DDP: fp16 and bf16 compression hooks stay within their rounding", "[ddp]") {
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  // Each rank's contribution is rounded once to the wire format (11 or 8
  // significant bits), then the sum once more: 2 ulps of the format.
  SECTION("fp16") {
    const auto problems = lt::on_ranks(size, [&](int r, auto group) {
      return check_ddp_grads(r, size, group, global, expected, {},
                             lockstep::nn::comm_hooks::fp16_compress(), 2e-3);
    });
    REQUIRE(lt::joined(problems).empty());
  }
  SECTION("bf16") {
    const auto problems = lt::on_ranks(size, [&](int r, auto group) {
      return check_ddp_grads(r, size, group, global, expected, {},
                             lockstep::nn::comm_hooks::bf16_compress(), 1.6e-2);
    });
    REQUIRE(lt::joined(problems).empty());
  }
}

TEST_CASE("DDP: a hook's then may use the GradBucket it was given", "[ddp]") {
  // As PyTorch's fut.then(lambda f: bucket.buffer()...): the lambda keeps a
  // reference to the bucket; several buckets, each completed at the end.
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  const lockstep::nn::CommHook in_f64 = [](lockstep::nn::GradBucket& bucket) {
    Tensor wide = bucket.buffer.to(lockstep::runtime::DType::f64);
    auto work = bucket.group.allreduce(wide, {.op = lockstep::collectives::ReduceOp::Sum});
    return lockstep::nn::CommHookResult{work, [&bucket, wide] {
                                          lockstep::runtime::NoGradGuard no_grad;
                                          bucket.buffer.copy_(wide);
                                        }};
  };
  const auto problems = lt::on_ranks(size, [&](int r, auto group) {
    // Caps of 512 bytes: one bucket per layer or two.
    return check_ddp_grads(r, size, group, global, expected,
                           {.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0005}, in_f64,
                           kTol);
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a hook that puts its result in bucket.buffer has it taken; a wrong size is "
          "refused",
          "[ddp]") {
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  SECTION("an f16 tensor in place of the buffer: averaged, within f16 rounding") {
    const lockstep::nn::CommHook to_f16 = [](lockstep::nn::GradBucket& bucket) {
      bucket.buffer = bucket.buffer.to(lockstep::runtime::DType::f16);
      return lockstep::nn::CommHookResult{
          bucket.group.allreduce(bucket.buffer, {.op = lockstep::collectives::ReduceOp::Sum}),
          nullptr};
    };
    const auto problems = lt::on_ranks(size, [&](int r, auto group) {
      return check_ddp_grads(r, size, group, global, expected, {}, to_f16, 2e-3);
    });
    REQUIRE(lt::joined(problems).empty());
  }
  SECTION("half the elements: an error naming the bucket and both sizes") {
    const lockstep::nn::CommHook half = [](lockstep::nn::GradBucket& bucket) {
      bucket.buffer = bucket.buffer.slice(0, 0, bucket.buffer.numel() / 2).contiguous();
      return lockstep::nn::CommHookResult{
          bucket.group.allreduce(bucket.buffer, {.op = lockstep::collectives::ReduceOp::Sum}),
          nullptr};
    };
    const auto problems = lt::on_ranks(size, [&](int r, auto group) {
      return check_ddp_grads(r, size, group, global, expected, {}, half, kTol);
    });
    for (const auto& p : problems) {
      REQUIRE_THAT(p, Catch::Contains("communication hook left a tensor of") &&
                          Catch::Contains("in bucket.buffer of bucket 0"));
    }
  }
}

TEST_CASE("DDP: a hook that throws after starting its all-reduce leaves the next iteration "
          "averaged",
          "[ddp]") {
  // That all-reduce runs on the bucket's buffer whenever the ranks get to it:
  // here rank 1's comes late, after rank 0's next backward has filled the
  // buffer again, and it summed into those gradients (wrong, without an error).
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  for (const bool as_view : {false, true}) {
    const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
      int calls = 0;
      auto ddp = std::make_shared<DistributedDataParallel>(
          lt::small_mlp(1), group,
          DdpOptions{.bucket_cap_mb = 0.0005,
                     .first_bucket_cap_mb = 0.0005,
                     .gradient_as_bucket_view = as_view});
      ddp->register_comm_hook([&calls, r](lockstep::nn::GradBucket& bucket) {
        const bool give_up = ++calls == 2;
        if (give_up && r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        auto work =
            bucket.group.allreduce(bucket.buffer, {.op = lockstep::collectives::ReduceOp::Sum});
        if (give_up) throw lockstep::Error("the hook gave up");
        return lockstep::nn::CommHookResult{work, nullptr};
      });
      const lt::Batch mine = lt::shard(global, r, size);
      const std::string first = lt::error_of([&] { lt::loss_of(*ddp, mine).backward(); });
      if (first != "the hook gave up") return "first backward: " + first;
      ddp->module().zero_grad();
      lt::loss_of(*ddp, mine).backward();
      return lt::grads_mismatch(ddp->module(), expected, kTol);
    });
    INFO("gradient_as_bucket_view " << as_view);
    REQUIRE(lt::joined(problems).empty());
  }
}

namespace {

// Identity whose output's gradient hook throws while `fail` is set: a
// backward that fails part-way, after the later layers' buckets launched.
class ThrowInBackward : public lockstep::nn::Module {
 public:
  Tensor forward(const Tensor& x) override {
    Tensor y = x * 1.0;
    y.register_hook([this](const Tensor& g) -> Tensor {
      if (fail) throw lockstep::Error("bad batch");
      return g;
    });
    return y;
  }
  bool fail = false;
};

// Linear(in, hidden), the thrower, ReLU, Linear(hidden, hidden), ReLU,
// Linear(hidden, out), initialised alike on every rank.
struct ThrowingMlp {
  std::shared_ptr<lockstep::nn::Sequential> model;
  std::shared_ptr<ThrowInBackward> thrower;
};
ThrowingMlp throwing_mlp(int64_t in, int64_t hidden, int64_t out) {
  lockstep::runtime::Generator g(1);
  auto model = std::make_shared<lockstep::nn::Sequential>();
  model->push_back(std::make_shared<lockstep::nn::Linear>(in, hidden, true, g));
  auto thrower = model->push_back(std::make_shared<ThrowInBackward>());
  model->push_back(std::make_shared<lockstep::nn::ReLU>());
  model->push_back(std::make_shared<lockstep::nn::Linear>(hidden, hidden, true, g));
  model->push_back(std::make_shared<lockstep::nn::ReLU>());
  model->push_back(std::make_shared<lockstep::nn::Linear>(hidden, out, true, g));
  return {model, thrower};
}

// A flag one rank thread raises and another waits for.
struct Signal {
  void raise() {
    std::lock_guard lock(mutex);
    raised = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return raised; });
  }
  std::mutex mutex;
  std::condition_variable cv;
  bool raised = false;
};

}  // namespace

TEST_CASE("DDP: a backward that fails on every rank after buckets launched leaves the next "
          "iteration averaged, also when .grad is zeroed in between",
          "[ddp]") {
  // The pattern of PyTorch users who catch an error, skip the batch with
  // zero_grad and go on. With gradient_as_bucket_view, .grad was the bucket
  // that the failed step's all-reduce still wrote into after zero_grad(false)
  // here (rank 1 reaches it later), so the next average held that step too.
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  for (const bool as_view : {false, true}) {
    Signal rank0_zeroed;
    const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
      struct RaiseOnExit {  // rank 1 must not wait for a rank 0 that failed
        Signal* signal;
        ~RaiseOnExit() {
          if (signal) signal->raise();
        }
      } raise_on_exit{r == 0 ? &rank0_zeroed : nullptr};
      auto [model, thrower] = throwing_mlp(12, 16, 5);
      auto ddp = std::make_shared<DistributedDataParallel>(
          model, group,
          DdpOptions{.bucket_cap_mb = 0.0005,
                     .first_bucket_cap_mb = 0.0005,
                     .gradient_as_bucket_view = as_view});
      lockstep::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
      const lt::Batch mine = lt::shard(global, r, size);
      lt::loss_of(*ddp, mine).backward();  // the buckets are the .grad from here on
      opt.zero_grad(/*set_to_none=*/false);
      thrower->fail = true;
      Tensor loss = lt::loss_of(*ddp, mine);
      if (r == 1) rank0_zeroed.wait();
      const std::string error = lt::error_of([&] { loss.backward(); });
      if (error != "bad batch") return "failed backward: " + error;
      // Rank 1's buffer keeps its gradients for the all-reduce (dropping
      // them as .grad), so that rank 0's .grad gets them if it still is the
      // bucket.
      opt.zero_grad(/*set_to_none=*/r == 1);
      if (r == 0) rank0_zeroed.raise();
      thrower->fail = false;
      lt::loss_of(*ddp, mine).backward();
      return lt::grads_mismatch(ddp->module(), expected, kTol);
    });
    INFO("gradient_as_bucket_view " << as_view);
    REQUIRE(lt::joined(problems).empty());
  }
}

TEST_CASE("DDP: after a backward that failed on every rank, rank 0 may evaluate alone in "
          "eval mode before the others' next collective",
          "[ddp]") {
  // The epoch's last batch fails on every rank alike and is skipped; rank 0
  // validates in eval mode (which communicates nothing) and all ranks then
  // all-reduce a metric. Rank 0's eval forward ran the check of the failed
  // backward (a barrier) there, against the other ranks' all-reduce: the
  // group was declared unusable though every rank had failed at one point.
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto [model, thrower] = throwing_mlp(12, 16, 5);
    auto ddp = std::make_shared<DistributedDataParallel>(
        model, group, DdpOptions{.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0005});
    const lt::Batch mine = lt::shard(global, r, size);
    thrower->fail = true;
    const std::string error = lt::error_of([&] { lt::loss_of(*ddp, mine).backward(); });
    if (error != "bad batch") return "failed backward: " + error;
    thrower->fail = false;
    ddp->zero_grad();
    if (r == 0) {
      ddp->eval();
      lt::loss_of(*ddp, mine);
      ddp->train();
    }
    Tensor metric = Tensor::ones({1});
    const std::string metric_error = lt::error_of(
        [&] { group->allreduce(metric, {.op = lockstep::collectives::ReduceOp::Sum})->wait(); });
    if (metric_error != "<no exception>") return "metric all-reduce: " + metric_error;
    const std::string step_error = lt::error_of([&] { lt::loss_of(*ddp, mine).backward(); });
    if (step_error != "<no exception>") return "next step: " + step_error;
    return lt::grads_mismatch(ddp->module(), expected, kTol);
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a rank that skips a batch whose backward failed part-way there only fails "
          "the next step on every rank, naming the cause, instead of averaging mismatched "
          "buckets",
          "[ddp]") {
  // Rank 0's backward throws after two of its three (equal) buckets started
  // their all-reduce; rank 1's error comes before backward. Both skip the
  // batch. Rank 1's next backward paired its buckets 0 and 1 with rank 0's
  // failed ones and its bucket 2 with rank 0's next bucket 0: its gradients
  // were wrong, without an error, and the ranks stayed one bucket apart.
  const int size = 2;
  const auto global = lt::global_batch(16, 9, 8);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto [model, thrower] = throwing_mlp(8, 8, 8);
    // A layer per bucket: 72 floats each.
    auto ddp = std::make_shared<DistributedDataParallel>(
        model, group, DdpOptions{.bucket_cap_mb = 0.00027, .first_bucket_cap_mb = 0.00027});
    if (ddp->buckets().size() != 3) return "expected 3 buckets";
    lockstep::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
    const lt::Batch mine = lt::shard(global, r, size);
    const auto loss = [&] {
      return lockstep::runtime::cross_entropy(ddp->forward(mine.x), mine.y);
    };
    loss().backward();
    opt.step();
    opt.zero_grad();
    thrower->fail = true;
    std::string error = lt::error_of([&] {
      if (r == 1) throw lockstep::Error("bad batch");  // say, a shape check before backward
      loss().backward();
    });
    if (error != "bad batch") return "failed step: " + error;
    opt.zero_grad();
    thrower->fail = false;
    error = lt::error_of([&] { loss().backward(); });
    if (r == 0 && error.find("this rank's previous backward failed after starting the "
                             "all-reduce of 2 of its 3 gradient bucket(s)") == std::string::npos)
      return "next step: " + (error.empty() ? std::string("no error") : error);
    if (r == 1 && error.find("previous backward failed part-way") == std::string::npos)
      return "next step: " + (error.empty() ? std::string("no error") : error);
    return "";
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a communication hook whose `then` throws leaves no all-reduce writing into "
          ".grad after the error",
          "[ddp]") {
  // Bucket 0's `then` throws on every rank, after every bucket started. The
  // error left bucket 1's all-reduce in flight (here rank 1 starts it late),
  // and with gradient_as_bucket_view it wrote that step's average into
  // .grad after rank 0 had zeroed it to skip the batch.
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    bool fail = false;
    auto ddp = std::make_shared<DistributedDataParallel>(
        lt::small_mlp(1), group,
        DdpOptions{.bucket_cap_mb = 0.0005,
                   .first_bucket_cap_mb = 0.0005,
                   .gradient_as_bucket_view = true});
    ddp->register_comm_hook([&fail, r](lockstep::nn::GradBucket& bucket) {
      const bool late = fail && r == 1 && bucket.index == 1;
      if (late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      auto work =
          bucket.group.allreduce(bucket.buffer, {.op = lockstep::collectives::ReduceOp::Sum});
      std::function<void()> then;
      if (fail && bucket.index == 0) then = [] { throw lockstep::Error("decompression failed"); };
      return lockstep::nn::CommHookResult{work, then};
    });
    lockstep::optim::SGD opt(ddp->parameters(), {.lr = 0.1});
    const lt::Batch mine = lt::shard(global, r, size);
    lt::loss_of(*ddp, mine).backward();  // the buckets are the .grad from here on
    if (ddp->buckets().size() < 2) return "expected 2 buckets or more";
    opt.zero_grad(/*set_to_none=*/false);
    fail = true;
    const std::string error = lt::error_of([&] { lt::loss_of(*ddp, mine).backward(); });
    if (error != "decompression failed") return "failed backward: " + error;
    // Rank 1's buffers keep their gradients for the all-reduce (see above).
    opt.zero_grad(/*set_to_none=*/r == 1);
    fail = false;
    lt::loss_of(*ddp, mine).backward();
    return lt::grads_mismatch(ddp->module(), expected, kTol);
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a second communication hook is refused, the first kept", "[ddp]") {
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(1), group);
    ddp->register_comm_hook(lockstep::nn::comm_hooks::fp16_compress());
    const std::string error =
        lt::error_of([&] { ddp->register_comm_hook(lockstep::nn::comm_hooks::bf16_compress()); });
    if (error.find("a hook is already registered") == std::string::npos)
      return "second hook: " + (error.empty() ? std::string("accepted") : error);
    lt::loss_of(*ddp, lt::shard(global, r, size)).backward();
    // Within fp16's rounding (bf16's would be 8x coarser).
    return lt::grads_mismatch(ddp->module(), expected, 2e-3);
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a hook registered after a forward but before any backward is taken; after a "
          "backward it is refused",
          "[ddp]") {
  // A forward that checks the output's shape first, as PyTorch allows: it
  // was refused as if a backward had run.
  const int size = 2;
  const auto global = lt::global_batch(16, 9);
  const auto expected = reference_grads(global, 1);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(1), group);
    (void)lt::loss_of(*ddp, lt::shard(global, r, size));
    ddp->register_comm_hook(lockstep::nn::comm_hooks::fp16_compress());
    lt::loss_of(*ddp, lt::shard(global, r, size)).backward();
    if (auto problem = lt::grads_mismatch(ddp->module(), expected, 2e-3); !problem.empty())
      return problem;
    auto late = std::make_shared<DistributedDataParallel>(lt::small_mlp(1), group);
    {
      auto guard = late->no_sync();
      lt::loss_of(*late, lt::shard(global, r, size)).backward();
    }
    const std::string error =
        lt::error_of([&] { late->register_comm_hook(lockstep::nn::comm_hooks::fp16_compress()); });
    if (error.find("before the first backward") == std::string::npos)
      return "after a backward: " + (error.empty() ? std::string("accepted") : error);
    return "";
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: gradient_as_bucket_view makes .grad a view into the bucket", "[ddp]") {
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(1), group,
                                                         DdpOptions{.gradient_as_bucket_view = true});
    lt::loss_of(*ddp, lt::shard(lt::global_batch(8, 1), r, 2)).backward();
    const auto params = ddp->module().parameters();
    // One bucket (default caps): every gradient shares its storage.
    for (const Tensor& p : params) {
      if (p.grad().storage() != params[0].grad().storage()) return "a .grad outside the bucket";
    }
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a .grad kept from one iteration is left alone by the next", "[ddp]") {
  // With .grad set to none between iterations, DDP hands the bucket's slot
  // out as .grad and reduces the next iteration elsewhere; with .grad kept,
  // the next iteration accumulates into it, as without DDP. Over shm the
  // buckets (75 KB, past the one-round path) come from the group's shared
  // pool and are all-reduced in place.
  const int size = 2;
  const int64_t hidden = 128;
  const auto first = lt::global_batch(8, 31), second = lt::global_batch(8, 32);
  const auto expected_first = reference_grads(first, 1, hidden);
  const auto expected_second = reference_grads(second, 1, hidden);
  const bool set_to_none = GENERATE(true, false);
  // gloo where built in; shm always.
  const std::string backend =
      GENERATE(filter([](const std::string& b) { return lt::backend_skip_reason(b).empty(); },
                      values<std::string>({"gloo", "shm"})));
  CAPTURE(set_to_none, backend);
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(1, 12, hidden), group);
    if (ddp->buckets().at(0).in_shared_memory != (backend == "shm")) {
      return "buckets in shared memory: expected only over shm";
    }
    const auto params = ddp->module().named_parameters();
    for (int round = 0; round < 3; ++round) {  // the third reuses the first's memory
      lt::loss_of(*ddp, lt::shard(first, r, size)).backward();
      std::vector<Tensor> kept, values;
      for (const auto& [name, p] : params) {
        kept.push_back(p.grad());
        values.push_back(p.grad().clone());
      }
      for (size_t i = 0; i < params.size(); ++i) {
        auto problem = lt::mismatch(params[i].first, values[i], expected_first[i], kTol);
        if (!problem.empty()) return fmt::format("round {}, first backward: {}", round, problem);
      }
      if (set_to_none) {
        for (const auto& [name, p] : params) Tensor(p).set_grad(Tensor{});
      }
      lt::loss_of(*ddp, lt::shard(second, r, size)).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = params[i].first;
        const Tensor& now = params[i].second.grad();
        if (set_to_none) {
          if (now.storage() == kept[i].storage()) return name + ": the new .grad reuses the kept one";
          auto problem = lt::mismatch(name + " (kept)", kept[i], values[i], 0.0);
          if (!problem.empty()) return fmt::format("round {}: {}", round, problem);
          problem = lt::mismatch(name, now, expected_second[i], kTol);
          if (!problem.empty()) return fmt::format("round {}: {}", round, problem);
        } else {
          if (now.storage() != kept[i].storage()) return name + ": .grad was replaced, not accumulated";
          auto problem = lt::mismatch(name, now, lockstep::runtime::add(expected_first[i], expected_second[i]), kTol);
          if (!problem.empty()) return fmt::format("round {}: {}", round, problem);
        }
      }
      for (const auto& [name, p] : params) Tensor(p).set_grad(Tensor{});
    }
    return "";
  }, "ddp", backend);
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: the first bucket's all-reduce starts while backward is still running", "[ddp]") {
  // Ten parameters; a first bucket of ~100 bytes holds only the last layer's
  // bias (20 bytes) and weight: it must launch before the other gradients exist.
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(
        lt::small_mlp(1), group, DdpOptions{.bucket_cap_mb = 0.001, .first_bucket_cap_mb = 0.0001});
    lt::loss_of(*ddp, lt::shard(lt::global_batch(8, 3), r, 2)).backward();
    const auto& s = ddp->stats();
    if (s.gradients_expected != 6) return fmt::format("expected 6 gradients, got {}", s.gradients_expected);
    if (s.ready_at_first_launch >= s.gradients_expected) {
      return fmt::format("the first bucket started only after {} of {} gradients were ready",
                         s.ready_at_first_launch, s.gradients_expected);
    }
    if (s.bucket_bytes.size() < 2) return "expected several buckets";
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}
