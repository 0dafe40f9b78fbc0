// The GPT (models/gpt.h) against PyTorch, under DDP and DataParallel, and its
// sampler.
//
// Fidelity: tests/nn/reference/gpt_reference.safetensors holds a small
// nanoGPT model's weights, a batch, and PyTorch 1.13's logits, loss and
// gradients on it (written by make_gpt_reference.py there). Loaded by name
// into our model, every value matches within f32 rounding:
// |ours - PyTorch's| <= 5e-6 * max |PyTorch's tensor|, per tensor (the
// largest difference seen is 3e-7 of that scale).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "lockstep/models/models.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/checkpoint/safetensors.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"
#include "support/tokens.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
namespace models = lockstep::models;
using lockstep::runtime::Device;
using lockstep::runtime::Tensor;

using lockstep::testing::tokens;

namespace {

struct Reference {
  models::GptConfig config;
  nn::StateDict weights;
  std::map<std::string, Tensor> other;  // input.*, output.*, grad.*
};

const Reference& reference() {
  static const Reference ref = [] {
    const auto file = lr::read_safetensors(std::string(LOCKSTEP_SOURCE_DIR) +
                                               "/tests/nn/reference/gpt_reference.safetensors",
                                           {.require_checksum = false});
    const auto c = nlohmann::json::parse(file.metadata.at("config"));
    Reference r;
    r.config = {.vocab_size = c["vocab_size"],
                .block_size = c["block_size"],
                .n_layer = c["n_layer"],
                .n_head = c["n_head"],
                .n_embd = c["n_embd"]};
    for (const auto& [name, t] : file.tensors) {
      const bool weight = name.rfind("input.", 0) != 0 && name.rfind("output.", 0) != 0 &&
                          name.rfind("grad.", 0) != 0;
      if (weight) {
        r.weights.insert(name, t);
      } else {
        r.other[name] = t;
      }
    }
    return r;
  }();
  return ref;
}

// "" when a is within tol * max |b| of b everywhere.
std::string off(const std::string& what, const Tensor& a, const Tensor& b, double tol = 5e-6) {
  if (!a.defined()) return what + ": undefined";
  if (a.shape() != b.shape()) return what + ": shapes differ";
  const auto va = lt::values(a), vb = lt::values(b);
  double scale = 0.0;
  for (double v : vb) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::abs(va[i] - vb[i]) > tol * scale)
      return fmt::format("{}[{}]: {} vs PyTorch's {}", what, i, va[i], vb[i]);
  }
  return "";
}

models::GptConfig tiny() {
  return {.vocab_size = 40, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
}


}  // namespace

TEST_CASE("GPT: parameter names and order are nanoGPT's; lm_head is tied to wte",
          "[nn][gpt]") {
  const auto& ref = reference();
  auto model = models::gpt(ref.config, 1);
  CHECK(model->state_dict().keys() == ref.weights.keys());
  CHECK(model->lm_head->weight.is_same(model->wte()->weight));
  // Listed once by parameters(), under its first name.
  int64_t named_wte = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    CHECK(name != "lm_head.weight");
    named_wte += name == "transformer.wte.weight";
  }
  CHECK(named_wte == 1);
  CHECK(model->num_parameters() == ref.config.num_parameters());
  CHECK(models::GptConfig::gpt2().num_parameters() == 124'439'808);
}

TEST_CASE("GPT: logits, loss and every gradient match PyTorch's on the same weights and tokens",
          "[nn][gpt]") {
  const auto& ref = reference();
  auto model = models::gpt(ref.config, 1);
  model->load_state_dict(ref.weights);
  const nn::Values out =
      model->forward_values({ref.other.at("input.idx"), ref.other.at("input.targets")});
  CHECK(off("logits", out.tensor(0), ref.other.at("output.logits")) == "");
  CHECK(off("loss", out.tensor(1).reshape({1}), ref.other.at("output.loss")) == "");
  out.tensor(1).backward();
  int64_t compared = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    INFO(name);
    CHECK(off("grad of " + name, p.grad(), ref.other.at("grad." + name)) == "");
    ++compared;
  }
  CHECK(compared == static_cast<int64_t>(ref.weights.size()) - 1);  // the tied weight once
}

TEST_CASE("GPT: DDP at 2 ranks equals one process on the doubled batch", "[nn][gpt][ddp]") {
  const auto [idx, targets] = tokens(4, 9, tiny().vocab_size, 3);
  auto alone = models::gpt(tiny(), 5);
  alone->forward_values({idx, targets}).tensor(1).backward();
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = models::gpt(tiny(), 5);
    nn::DistributedDataParallel ddp(model, group);
    const nn::Values out = ddp.forward_values(
        {idx.slice(0, 2 * r, 2 * r + 2).contiguous(), targets.slice(0, 2 * r, 2 * r + 2).contiguous()});
    out.tensor(1).backward();
    const auto expected = alone->named_parameters();
    const auto got = model->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      if (auto m = lt::mismatch(got[i].first, got[i].second.grad(), expected[i].second.grad(), 1e-5);
          !m.empty())
        return m;
    }
    return "";
  });
  for (const auto& p : problems) CHECK(p == "");
}

TEST_CASE("GPT: DataParallel on CPU replicas gives one device's gradients", "[nn][gpt][data_parallel]") {
  const auto [idx, targets] = tokens(4, 7, tiny().vocab_size, 4);
  auto model = models::gpt(tiny(), 6);
  nn::DataParallel dp(model, {Device::cpu(), Device::cpu()});
  const nn::Values out = dp.forward_values({idx, targets});
  REQUIRE(out.tensor(1).shape() == lr::Shape{2});  // one loss per replica
  lr::mean(out.tensor(1)).backward();
  auto alone = models::gpt(tiny(), 6);
  alone->forward_values({idx, targets}).tensor(1).backward();
  const auto a = model->named_parameters(), b = alone->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    CHECK(lt::mismatch(a[i].first, a[i].second.grad(), b[i].second.grad(), 1e-5) == "");
}

TEST_CASE("GPT: sampling is reproducible, stays in the vocabulary, and top_k 1 is greedy",
          "[nn][gpt]") {
  auto model = models::gpt(tiny(), 7);
  model->eval();
  const std::vector<int64_t> prompt{1, 2, 3};
  lr::Generator g1(11), g2(11);
  // Longer than block_size: the context is cropped to the last 16 tokens.
  const auto a = models::sample(*model, prompt, 20, g1, {.temperature = 0.8, .top_k = 5});
  const auto b = models::sample(*model, prompt, 20, g2, {.temperature = 0.8, .top_k = 5});
  CHECK(a == b);
  REQUIRE(a.size() == 20);
  for (int64_t t : a) CHECK((t >= 0 && t < tiny().vocab_size));

  lr::Generator g3(1);
  const auto greedy = models::sample(*model, prompt, 1, g3, {.top_k = 1});
  const Tensor logits = (*model)(Tensor::from_vector(prompt, {1, 3}));
  const auto last = lt::values(logits.select(1, 2).select(0, 0));
  CHECK(greedy[0] == std::max_element(last.begin(), last.end()) - last.begin());

  CHECK_THAT(lt::error_of([&] { (*model)(Tensor::zeros({1, 17}, lr::DType::i64)); }),
             Catch::Contains("17 tokens does not fit block_size 16"));
  CHECK_THAT(lt::error_of([&] { (*model)(Tensor::zeros({1, 4})); }),
             Catch::Contains("token ids must be an integer tensor"));
  // No tokens is not too many: it used to be told to crop the context.
  const std::string empty =
      lt::error_of([&] { (*model)(Tensor::zeros({2, 0}, lr::DType::i64)); });
  CHECK_THAT(empty, Catch::Contains("token ids [2, 0] hold no tokens") &&
                        Catch::Contains("at least one") && !Catch::Contains("crop"));
  CHECK_THAT(lt::error_of([&] { models::sample(*model, prompt, 1, g3, {.top_k = -1}); }),
             Catch::Contains("top_k -1 must be 0"));
  CHECK_THAT(lt::error_of([&] { models::sample(*model, {99}, 1, g3); }),
             Catch::Contains("prompt token 99 is outside [0, 40)"));
}

TEST_CASE("GPT: sampling from a model with NaN weights is an error, not the last token",
          "[nn][gpt]") {
  auto model = models::gpt(tiny(), 7);
  model->eval();
  {
    lr::NoGradGuard no_grad;
    model->ln_f()->weight.fill_(std::nan(""));
  }
  lr::Generator g(1);
  CHECK_THAT(lt::error_of([&] { models::sample(*model, {1, 2}, 3, g); }),
             Catch::Contains("logit nan to token 0 when sampling token 1 of 3") &&
                 Catch::Contains("must be finite"));
}

TEST_CASE("GPT: a target of -1 is skipped by the loss, as nanoGPT's ignore_index=-1",
          "[nn][gpt]") {
  auto model = models::gpt(tiny(), 7);
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{2, -1, 4, -1, -1, 7}, {2, 3});
  const nn::Values out = model->forward_values({idx, targets});
  // The mean over the three kept positions (0, 2 and 5 of the six).
  const Tensor logits = out.tensor(0).reshape({6, tiny().vocab_size}).detach();
  const Tensor kept =
      lr::cat({logits.slice(0, 0, 1), logits.slice(0, 2, 3), logits.slice(0, 5, 6)});
  const Tensor want =
      lr::cross_entropy(kept, Tensor::from_vector(std::vector<int64_t>{2, 4, 7}, {3}));
  CHECK(out.tensor(1).item() == Approx(want.item()).epsilon(1e-6));
}
