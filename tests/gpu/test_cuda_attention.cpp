// scaled_dot_product_attention and the GPT on CUDA against the CPU, forward
// and backward: causal and not, a padding mask, odd lengths, several head
// dims, f32 (and f64 for the attention). Tolerances: f32 1e-4 + 1e-4
// (relative + absolute; different summation orders), f64 1e-10 + 1e-10.
#include <catch2/catch.hpp>

#include "gpu/cuda_op_check.h"
#include "lockstep/models/models.h"
#include "lockstep/runtime/ops/attention.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
namespace nn = lockstep::nn;
namespace models = lockstep::models;

TEST_CASE("CUDA: scaled_dot_product_attention matches the CPU, forward and backward",
          "[gpu][cuda][attention]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  struct Case {
    int64_t b, h, l, s, e, ev;
    bool causal, mask;
  };
  const std::vector<Case> cases = {
      {2, 3, 17, 17, 16, 16, true, false},  {1, 1, 65, 65, 64, 64, true, false},
      {2, 2, 33, 47, 32, 48, false, false}, {2, 4, 40, 40, 128, 128, false, true},
      {1, 2, 1, 9, 64, 64, false, false},
  };
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const Case& c : cases) {
      INFO(dtype_name(dtype) << " b " << c.b << " h " << c.h << " l " << c.l << " s " << c.s
                             << " e " << c.e << " causal " << c.causal << " mask " << c.mask);
      const double rtol = dtype == DType::f64 ? 1e-10 : 1e-4, atol = rtol;
      const Tensor q = randn_cpu({c.b, c.h, c.l, c.e}, 1, dtype);
      const Tensor k = randn_cpu({c.b, c.h, c.s, c.e}, 2, dtype);
      const Tensor v = randn_cpu({c.b, c.h, c.s, c.ev}, 3, dtype);
      const Tensor gy = randn_cpu({c.b, c.h, c.l, c.ev}, 4, dtype);
      Tensor mask;
      if (c.mask) {  // the last quarter of each sequence's keys is padding
        std::vector<uint8_t> keep(static_cast<size_t>(c.b * c.s));
        for (int64_t i = 0; i < c.b * c.s; ++i) keep[static_cast<size_t>(i)] = i % c.s < c.s * 3 / 4;
        mask = Tensor::from_vector(keep, {c.b, 1, 1, c.s}).to(DType::boolean);
      }
      const auto run = [&](Device device) {
        // Leaves on `device` (to() of a CPU tensor is a graph node there).
        Tensor qd = q.to(device).detach().requires_grad_(),
               kd = k.to(device).detach().requires_grad_(),
               vd = v.to(device).detach().requires_grad_();
        AttentionOptions o{.causal = c.causal};
        if (mask.defined()) o.mask = mask.to(device);
        Tensor y = scaled_dot_product_attention(qd, kd, vd, o);
        y.backward(gy.to(device));
        return std::vector<Tensor>{y, qd.grad(), kd.grad(), vd.grad()};
      };
      const auto want = run(Device::cpu());
      const auto got = run(cuda0());
      const char* names[] = {"output", "grad q", "grad k", "grad v"};
      for (size_t i = 0; i < want.size(); ++i) check_close_to(got[i], want[i], rtol, atol, names[i]);
    }
  }
}

TEST_CASE("CUDA: a GPT's loss and gradients match the CPU's", "[gpu][cuda][gpt]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const models::GptConfig config{.vocab_size = 64, .block_size = 32, .n_layer = 2, .n_head = 4,
                             .n_embd = 64};
  auto cpu = models::gpt(config, 3);
  auto gpu = models::gpt(config, 3);
  gpu->to(cuda0());
  Generator g(5);
  std::vector<int64_t> ids(2 * 25);
  for (auto& id : ids) id = static_cast<int64_t>(g.next_u32() % 64);
  const Tensor all = Tensor::from_vector(ids, {2, 25});
  const Tensor x = all.slice(1, 0, 24).contiguous(), y = all.slice(1, 1, 25).contiguous();
  const Tensor loss_cpu = cpu->forward_values({x, y}).tensor(1);
  const Tensor loss_gpu = gpu->forward_values({x.to(cuda0()), y.to(cuda0())}).tensor(1);
  check_close_to(loss_gpu, loss_cpu, 1e-4, 1e-4, "loss");
  loss_cpu.backward();
  loss_gpu.backward();
  const auto a = gpu->named_parameters(), b = cpu->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) check_close_to(a[i].second.grad(), b[i].second.grad(), 1e-3, 1e-5, a[i].first);
}
