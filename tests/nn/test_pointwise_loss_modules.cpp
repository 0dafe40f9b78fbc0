// BCELoss, BCEWithLogitsLoss, L1Loss, SmoothL1Loss, HuberLoss, NLLLoss and
// KLDivLoss as modules: the same numbers as the functions, callable through
// forward_values (as DataParallel and DDP call them), weights as buffers,
// replicas, errors.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "lockstep/nn/functional.h"
#include "lockstep/nn/loss.h"
#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/random.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
namespace F = lockstep::nn::functional;
using lr::Tensor;

TEST_CASE("the elementwise loss modules equal their functions, through forward_values too",
          "[nn][loss]") {
  lr::Generator g(11);
  const Tensor x = lr::randn({4, 3}, lr::DType::f32, g);
  const Tensor p = lr::sigmoid(x);
  const Tensor y = lr::sigmoid(lr::randn({4, 3}, lr::DType::f32, g));
  const Tensor w = Tensor::from_vector<float>({1, 2, 0.5f}, {3});
  const Tensor pw = Tensor::from_vector<float>({3, 1, 2}, {3});

  nn::BCELoss bce({.weight = w, .reduction = lr::Reduction::Sum});
  CHECK(lt::bitwise_equal(bce(p, y), F::binary_cross_entropy(
                                         p, y, {.weight = w, .reduction = lr::Reduction::Sum})));
  nn::BCEWithLogitsLoss bcel({.pos_weight = pw});
  CHECK(lt::bitwise_equal(bcel(x, y),
                          F::binary_cross_entropy_with_logits(x, y, {.pos_weight = pw})));
  nn::L1Loss l1;
  nn::SmoothL1Loss sl1(lr::Reduction::Mean, 0.5);
  nn::HuberLoss hub(lr::Reduction::None, 2.0);
  nn::KLDivLoss kl(lr::KlDivReduction::BatchMean);
  const Tensor logp = lr::log_softmax(x, 1);
  CHECK(lt::bitwise_equal(kl(logp, y), F::kl_div(logp, y, lr::KlDivReduction::BatchMean)));
  CHECK(lt::bitwise_equal(l1(x, y), F::l1_loss(x, y)));
  CHECK(lt::bitwise_equal(sl1(x, y), F::smooth_l1_loss(x, y, lr::Reduction::Mean, 0.5)));
  CHECK(lt::bitwise_equal(hub(x, y), F::huber_loss(x, y, lr::Reduction::None, 2.0)));

  std::vector<std::pair<nn::PairLoss*, Tensor>> all = {
      {&bce, p}, {&bcel, x}, {&l1, x}, {&sl1, x}, {&hub, x}, {&kl, logp}};
  for (auto& [m, in] : all) {
    INFO(m->type_name());
    CHECK(lt::bitwise_equal(m->forward_values({in, y}).tensor(0), m->forward(in, y)));
    CHECK_THAT(lt::error_of([&] { m->forward_values({in}); }),
               Catch::Contains(m->type_name() + " takes two tensors"));
    CHECK_THAT(lt::error_of([&] { m->forward(in); }), Catch::Contains("takes (input, target)"));
    // A replica computes the same loss once DataParallel has copied the buffers in.
    auto replica = std::dynamic_pointer_cast<nn::PairLoss>(m->replicate());
    REQUIRE(replica);
    CHECK(lt::bitwise_equal(replica->forward(in, y), m->forward(in, y)));
  }
}

TEST_CASE("BCE loss weights are buffers, in state_dict under PyTorch's names", "[nn][loss]") {
  const Tensor w = Tensor::ones({3}), pw = Tensor::full({3}, 2.0);
  CHECK(nn::BCELoss({.weight = w}).state_dict().keys() == std::vector<std::string>{"weight"});
  CHECK(nn::BCELoss().state_dict().size() == 0);
  CHECK(nn::BCEWithLogitsLoss({.weight = w, .pos_weight = pw}).state_dict().keys() ==
        std::vector<std::string>{"weight", "pos_weight"});
  // The module uses its buffer, so a loaded or edited weight takes effect.
  nn::BCEWithLogitsLoss m({.pos_weight = pw});
  const Tensor x = Tensor::zeros({1, 3}), y = Tensor::ones({1, 3});
  const double before = m(x, y).item();
  m.pos_weight.fill_(4.0);
  CHECK(m(x, y).item() == Approx(2 * before));
}

TEST_CASE("NLLLoss equals nll_loss, keeps its weight as a buffer and passes forward_values",
          "[nn][loss]") {
  const Tensor x = lr::log_softmax(Tensor::from_vector<float>({1, 2, 3, 0, -1, 4}, {2, 3}), 1);
  const Tensor t = Tensor::from_vector<int64_t>({2, 0}, {2});
  const Tensor w = Tensor::from_vector<float>({3, 1, 2}, {3});
  nn::NLLLoss m({.weight = w, .ignore_index = -100});
  CHECK(lt::bitwise_equal(m(x, t), F::nll_loss(x, t, {.weight = w, .ignore_index = -100})));
  CHECK(lt::bitwise_equal(m.forward_values({x, t}).tensor(0), m(x, t)));
  CHECK(m.state_dict().keys() == std::vector<std::string>{"weight"});
  CHECK(m.extra_repr() == "ignore_index=-100");
  auto replica = std::dynamic_pointer_cast<nn::PairLoss>(m.replicate());
  CHECK(lt::bitwise_equal(replica->forward(x, t), m(x, t)));
}

TEST_CASE("CrossEntropyLoss takes a class weight, kept as a buffer", "[nn][loss]") {
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 0, -1, 4}, {2, 3});
  const Tensor t = Tensor::from_vector<int64_t>({2, 0}, {2});
  const Tensor w = Tensor::from_vector<float>({3, 1, 2}, {3});
  nn::CrossEntropyLoss m({.label_smoothing = 0.1, .weight = w});
  CHECK(lt::bitwise_equal(m(x, t), F::cross_entropy(x, t, w, 0.1)));
  CHECK(m.state_dict().keys() == std::vector<std::string>{"weight"});
  CHECK(nn::CrossEntropyLoss().state_dict().size() == 0);
  auto replica = m.replicate();
  CHECK(lt::bitwise_equal(replica->forward_values({x, t}).tensor(0), m(x, t)));
  // The buffer is what counts: a loaded or edited weight takes effect.
  m.weight.fill_(1.0);
  CHECK(m(x, t).item() == Approx(F::cross_entropy(x, t, 0.1).item()));
}

TEST_CASE("SmoothL1Loss and HuberLoss refuse a bad beta or delta when built", "[nn][loss]") {
  CHECK_THAT(lt::error_of([] { nn::SmoothL1Loss(lr::Reduction::Mean, -0.1); }),
             Catch::Contains("SmoothL1Loss: beta must be >= 0"));
  CHECK_THAT(lt::error_of([] { nn::HuberLoss(lr::Reduction::Mean, 0.0); }),
             Catch::Contains("HuberLoss: delta must be > 0"));
}
