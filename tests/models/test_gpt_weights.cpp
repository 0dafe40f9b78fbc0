// GPT weights from other programs: state_dicts laid out as nanoGPT and
// Hugging Face write them (one or both names of the tied embedding, Conv1D's
// transposed projections, torch.compile's key prefix, nanoGPT's bias=False, its
// causal-mask buffers, and position embeddings of a longer context).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "lockstep/models/models.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace models = lockstep::models;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using Catch::Contains;

namespace {

models::GptConfig tiny() {
  return {.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4};
}

// `from`'s state_dict without `drop`, with `replace` put in for `at`.
nn::StateDict edited(const nn::StateDict& from, const std::string& drop,
                     const std::string& at = "", const Tensor& replace = {}) {
  nn::StateDict out;
  for (const auto& [name, t] : from)
    if (name != drop) out.insert(name, name == at ? replace : t.clone());
  return out;
}

}  // namespace

TEST_CASE("GPT: a state_dict naming the tied embedding once loads it under both names",
          "[nn][gpt][state_dict]") {
  const auto source = models::gpt(tiny(), 1);
  const nn::StateDict saved = source->state_dict();
  // safetensors' save_model and HF's save_pretrained keep one name of a shared tensor.
  for (const std::string drop : {"lm_head.weight", "transformer.wte.weight"}) {
    const auto model = models::gpt(tiny(), 2);
    const nn::LoadResult r = model->load_state_dict(edited(saved, drop));
    CHECK(r.missing_keys.empty());
    CHECK(lt::values(model->lm_head->weight) == lt::values(source->wte()->weight));
    CHECK(model->lm_head->weight.is_same(model->wte()->weight));
  }
}

TEST_CASE("GPT: a state_dict with different values under the tied names is refused",
          "[nn][gpt][state_dict]") {
  const auto source = models::gpt(tiny(), 1);
  const auto model = models::gpt(tiny(), 2);
  const auto before = lt::values(model->wte()->weight);
  // An untied model's weights: lm_head.weight would silently overwrite wte's.
  const nn::StateDict untied =
      edited(source->state_dict(), "", "lm_head.weight", Tensor::zeros({11, 4}));
  CHECK_THAT(lt::error_of([&] { model->load_state_dict(untied); }),
             Contains("transformer.wte.weight and lm_head.weight are one tensor in this model "
                      "(tied), but the state_dict holds different values for them"));
  CHECK_THAT(lt::error_of([&] { model->load_state_dict(untied, /*strict=*/false); }),
             Contains("(tied)"));
  CHECK(lt::values(model->wte()->weight) == before);

  // The same values in another dtype are one value.
  nn::StateDict halves;
  for (const auto& [name, t] : source->state_dict()) {
    const Tensor half = t.to(DType::f16);
    halves.insert(name, name == "lm_head.weight" ? half.to(DType::f32) : half);
  }
  model->load_state_dict(halves);
  CHECK(lt::values(model->wte()->weight) == lt::values(source->wte()->weight.to(DType::f16)));
}

TEST_CASE("GPT: Hugging Face's Conv1D weights, [in, out], are refused with a hint to transpose",
          "[nn][gpt][state_dict]") {
  const auto source = models::gpt(tiny(), 1);
  const auto model = models::gpt(tiny(), 2);
  const auto before = lt::values(model->h()->at<models::GptBlock>(0)->attn->c_proj->weight);
  nn::StateDict hf;
  for (const auto& [name, t] : source->state_dict()) {
    const bool conv1d = name.find(".c_") != std::string::npos && t.dim() == 2;
    hf.insert(name, conv1d ? t.t().contiguous() : t);
  }
  const std::string msg = lt::error_of([&] { model->load_state_dict(hf); });
  CHECK_THAT(msg, Contains("size mismatch for transformer.h.0.attn.c_attn.weight: copying a "
                           "tensor with shape [4, 12] from the state_dict"));
  CHECK_THAT(msg, Contains("each is the transpose of the model's shape") &&
                      Contains("Hugging Face's Conv1D") && Contains("the square ones too"));
  // attn.c_proj is square: it fits transposed, and nothing was loaded.
  CHECK(lt::values(model->h()->at<models::GptBlock>(0)->attn->c_proj->weight) == before);

  // A mismatch of another kind gets no such hint.
  hf.erase("transformer.wpe.weight");
  hf.insert("transformer.wpe.weight", Tensor::zeros({5, 4}));
  CHECK_THAT(lt::error_of([&] { model->load_state_dict(hf); }), !Contains("transpose"));
}

TEST_CASE("GPT: a nanoGPT checkpoint of a compiled model gets a hint to strip \"_orig_mod.\"",
          "[nn][gpt][state_dict]") {
  const auto source = models::gpt(tiny(), 1);
  const auto model = models::gpt(tiny(), 2);
  nn::StateDict compiled;  // nanoGPT's train.py saves the torch.compile'd model's keys
  for (const auto& [name, t] : source->state_dict()) compiled.insert("_orig_mod." + name, t);
  CHECK_THAT(lt::error_of([&] { model->load_state_dict(compiled); }),
             Contains("compiled with torch.compile") &&
                 Contains("without_prefix(\"_orig_mod.\")"));
  model->load_state_dict(compiled.without_prefix("_orig_mod."));
  CHECK(lt::values(model->wte()->weight) == lt::values(source->wte()->weight));
}

TEST_CASE("GPT: Hugging Face's GPT2Model names, without \"transformer.\", get a hint to add it",
          "[nn][gpt][state_dict]") {
  const auto source = models::gpt(tiny(), 1);
  const auto model = models::gpt(tiny(), 2);
  // GPT2Model's file: the blocks without "transformer.", no lm_head, and each
  // block's causal-mask buffer, which this model does not keep.
  nn::StateDict hf;
  for (const auto& [name, t] : source->state_dict())
    if (name.starts_with("transformer.")) hf.insert(name.substr(12), t);
  hf.insert("h.0.attn.bias", Tensor::ones({1, 1, 4, 4}));
  CHECK_THAT(lt::error_of([&] { model->load_state_dict(hf); }),
             Contains("this model's keys are the state_dict's with \"transformer.\" in front (") &&
                 Contains("with_prefix(\"transformer.\")"));
  const nn::LoadResult r = model->load_state_dict(hf.with_prefix("transformer."), false);
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys == std::vector<std::string>{"transformer.h.0.attn.bias"});
  CHECK(lt::values(model->lm_head->weight) == lt::values(source->wte()->weight));
}

TEST_CASE("GPT: bias=false, as nanoGPT's GPTConfig(bias=False), has no Linear or LayerNorm bias",
          "[nn][gpt][state_dict]") {
  auto config = tiny();
  config.bias = false;
  const auto source = models::gpt(config, 1);
  nn::StateDict dict;  // nanoGPT's bias=False keys: weights only
  for (const auto& [name, t] : source->state_dict()) {
    INFO(name);
    CHECK_FALSE(name.ends_with(".bias"));
    dict.insert(name, t.clone());
  }
  CHECK(source->num_parameters() == config.num_parameters());
  CHECK(config.num_parameters() < tiny().num_parameters());
  // Such a dict loads strictly into a model built alike, and the model runs.
  const auto model = models::gpt(config, 2);
  model->load_state_dict(dict);
  CHECK(lt::values(model->ln_f()->weight) == lt::values(source->ln_f()->weight));
  CHECK_FALSE(model->ln_f()->bias.defined());
  const Tensor idx = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(lt::values(model->forward(idx)) == lt::values(source->forward(idx)));
  // A LayerNorm without bias is the one with a zero bias.
  nn::LayerNorm with({4}), without({4}, 1e-5, true, false);
  CHECK(without.state_dict().keys() == std::vector<std::string>{"weight"});
  CHECK_THAT(without.extra_repr(), Contains("bias=False"));
  CHECK_THAT(with.extra_repr(), !Contains("bias"));
  const Tensor x = Tensor::from_vector<float>({1, 2, 4, 8, -1, 0, 3, 2}, {2, 4});
  CHECK(lt::values(without.forward(x)) == lt::values(with.forward(x)));
  CHECK(without.replicate()->state_dict().keys() == std::vector<std::string>{"weight"});
}

TEST_CASE("GPT: nanoGPT's causal-mask buffers (attn.bias) are named as such, with how to load",
          "[nn][gpt][state_dict]") {
  const auto source = models::gpt(tiny(), 1);
  const auto model = models::gpt(tiny(), 2);
  // nanoGPT without flash attention registers the mask as the buffer
  // "attn.bias" [1, 1, block_size, block_size] of every block.
  nn::StateDict nano;
  for (const auto& [name, t] : source->state_dict()) nano.insert(name, t);
  nano.insert("transformer.h.0.attn.bias", Tensor::ones({1, 1, 4, 4}));
  const std::string error = lt::error_of([&] { model->load_state_dict(nano); });
  CHECK_THAT(error, Contains("\"transformer.h.0.attn.bias\" is the causal mask that nanoGPT "
                             "keeps as a buffer") &&
                        Contains("dict.erase(key)") && Contains("or load with strict=false"));
  nano.erase("transformer.h.0.attn.bias");
  model->load_state_dict(nano);
  CHECK(lt::values(model->wte()->weight) == lt::values(source->wte()->weight));
  // A key that only looks alike gets no such note.
  nano.insert("transformer.h.0.mlp.bias", Tensor::ones({4}));
  CHECK_THAT(lt::error_of([&] { model->load_state_dict(nano); }), !Contains("causal mask"));
}

TEST_CASE("GPT: position embeddings of a longer block_size get nanoGPT's crop as the hint, "
          "which then loads",
          "[nn][gpt][state_dict]") {
  // GPT-2's weights (block_size 1024) into a model of a shorter context, which
  // nanoGPT's crop_block_size makes by keeping the first rows of wpe.
  models::GptConfig longer = tiny();
  longer.block_size = 7;
  const auto source = models::gpt(longer, 1);
  const nn::StateDict saved = source->state_dict();
  const auto model = models::gpt(tiny(), 2);
  const std::string err = lt::error_of([&] { model->load_state_dict(saved); });
  CHECK_THAT(err, Contains("size mismatch for transformer.wpe.weight") &&
                      Contains("position embeddings for 7 positions, and this model's "
                               "block_size is 4") &&
                      Contains("crop_block_size") &&
                      Contains("dict.at(\"transformer.wpe.weight\").slice(0, 0, 4)") &&
                      Contains("build the model with block_size 7"));

  // What the hint says to do loads, and the model is the source on its first 4 positions.
  const Tensor cropped = saved.at("transformer.wpe.weight").slice(0, 0, 4);
  model->load_state_dict(edited(saved, "", "transformer.wpe.weight", cropped));
  const Tensor idx = Tensor::from_vector<int64_t>({3, 1, 4, 1}, {1, 4});
  CHECK(lt::values((*model)(idx)) == lt::values((*source)(idx)));

  // A shorter table than the model's is a plain mismatch: nothing to crop.
  const auto big = models::gpt(longer, 3);
  CHECK_THAT(lt::error_of([&] { big->load_state_dict(model->state_dict()); }),
             Contains("size mismatch for transformer.wpe.weight") &&
                 !Contains("crop_block_size"));
}

TEST_CASE("GPT: token embeddings of another vocab_size name the size to build the model with",
          "[nn][gpt][state_dict]") {
  // nanoGPT trained from scratch pads GPT-2's 50257 tokens to 50304; here a
  // tiny vocabulary of 11 tokens against the model's.
  models::GptConfig padded = tiny();
  padded.vocab_size = tiny().vocab_size + 3;
  const nn::StateDict saved = models::gpt(padded, 1)->state_dict();
  const auto model = models::gpt(tiny(), 2);
  const std::string err = lt::error_of([&] { model->load_state_dict(saved); });
  CHECK_THAT(err, Contains("size mismatch for transformer.wte.weight") &&
                      Contains(fmt::format("holds {} token embeddings, and this model's "
                                           "vocab_size is {}: build the model with vocab_size {}",
                                           padded.vocab_size, tiny().vocab_size,
                                           padded.vocab_size)));
  // The tied lm_head's mismatch does not repeat the hint.
  CHECK(err.find("token embeddings") == err.rfind("token embeddings"));
}
