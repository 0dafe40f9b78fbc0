// Module::load_state_dict: checks a state_dict against the model, then
// copies it in, so that a load that fails changes nothing.
#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "lockstep/nn/module.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/checkpoint/name_insertion.h"
#include "lockstep/runtime/error.h"

namespace lockstep::nn {

using runtime::NoGradGuard;

namespace {

bool same_view(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.storage_offset() == b.storage_offset() &&
         a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype();
}

// For each of the model's state_dict entries, the others that are the same
// tensor: tied weights, such as GPT's transformer.wte.weight and
// lm_head.weight, which state_dict() lists under every name.
std::vector<std::vector<size_t>> twins_of(const StateDict& own) {
  const auto& items = own.items();
  std::unordered_map<const runtime::Storage*, std::vector<size_t>> by_storage;
  for (size_t i = 0; i < items.size(); ++i)
    by_storage[items[i].second.storage().get()].push_back(i);
  std::vector<std::vector<size_t>> twins(items.size());
  for (const auto& [storage, at] : by_storage)
    for (size_t i : at)
      for (size_t j : at)
        if (i != j && same_view(items[i].second, items[j].second)) twins[i].push_back(j);
  return twins;
}

// The full names of the entries a state_dict may leave out
// (Module::optional_state), walked as state_dict() walks the tree.
void collect_optional(const Module& m, const std::string& prefix,
                      std::unordered_set<std::string>& out) {
  for (const auto& name : m.optional_state()) out.insert(prefix + name);
  for (const auto& [name, child] : m.child_list())
    collect_optional(*child, prefix + name + ".", out);
}

// Whether `a` and `b` give `dst` the same bits once converted to its dtype.
bool same_values_for(const Tensor& dst, const Tensor& a, const Tensor& b) {
  if (same_view(a, b)) return true;
  // Copied only where they are not yet dst's dtype in contiguous host memory.
  const auto converted = [&](const Tensor& t) {
    if (t.device().is_cpu() && t.dtype() == dst.dtype() && t.is_contiguous()) return t;
    Tensor out = Tensor::empty(dst.shape(), dst.dtype());
    NoGradGuard no_grad;
    out.copy_(t.to(runtime::Device::cpu()));
    return out;
  };
  const Tensor x = converted(a), y = converted(b);
  return std::memcmp(x.raw_data(), y.raw_data(), x.numel() * x.element_size()) == 0;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += fmt::format("{}\"{}\"", i ? ", " : "", names[i]);
  return out;
}

// A prefix that tells the state_dict's names from the model's
// (runtime/checkpoint/name_insertion.h): in front of every model name (a
// wrapper's "module.", torch.compile's "_orig_mod.", a training checkpoint's
// "model.") or of every dict name (a model saved without the name it has
// inside this one), said in load_state_dict's terms.
std::string prefix_hint(const LoadResult& r) {
  const auto found =
      runtime::name_insertion(r.missing_keys, r.unexpected_keys, /*front_only=*/true);
  if (!found) return "";
  const runtime::NameInsertion& best = *found;
  const bool in_dict = best.in_found;
  const size_t n = best.of;
  const std::string& p = best.segment;
  if (p == "module.")
    return in_dict
               ? "\n  (the state_dict was saved from a DistributedDataParallel or DataParallel "
                 "wrapper: its keys start with \"module.\"; load dict.without_prefix(\"module.\"), "
                 "or load it into the wrapper)"
               : "\n  (this model is a DistributedDataParallel or DataParallel wrapper and the "
                 "state_dict was saved from the bare model: load it into the wrapper's module())";
  if (p == "_orig_mod." && in_dict)
    return "\n  (the state_dict was saved from a model compiled with torch.compile, as "
           "nanoGPT's train.py saves it: its keys start with \"_orig_mod.\"; load "
           "dict.without_prefix(\"_orig_mod.\"))";
  const std::string how_many =
      best.count == n ? "" : fmt::format(" ({} of the {})", best.count, n);
  if (in_dict)
    return fmt::format(
        "\n  (the state_dict's keys are this model's with \"{}\" in front{}{}: load "
        "dict.under(\"{}\"), which keeps only those keys and takes the prefix off)",
        p, how_many, p == "model." ? ", as a training checkpoint keeps the model" : "", p);
  return fmt::format(
      "\n  (this model's keys are the state_dict's with \"{}\" in front{}: load "
      "dict.with_prefix(\"{}\"))",
      p, how_many, p);
}

// The unexpected keys that are a GPT attention's causal-mask buffer: "<attn>.bias" (and
// Hugging Face's "<attn>.masked_bias") beside a "<attn>.c_attn.weight" of the model. nanoGPT
// keeps the mask as a buffer when it runs without flash attention, and Hugging Face's GPT-2
// always, so their state_dicts hold it; it is a constant, not a weight, and this model's
// attention makes its own.
std::string causal_mask_hint(const StateDict& own, const LoadResult& r) {
  std::vector<std::string> masks;
  for (const auto& key : r.unexpected_keys) {
    const size_t dot = key.rfind('.');
    const std::string leaf = key.substr(dot + 1), attn = key.substr(0, dot + 1);
    const bool in_attn = attn == "attn." || attn.ends_with(".attn.");
    const bool mask_name = leaf == "bias" || leaf == "masked_bias";
    if (mask_name && in_attn && own.contains(attn + "c_attn.weight"))
      masks.push_back(key);
  }
  if (masks.empty()) return "";
  const std::string which = masks.size() == 1
                                ? fmt::format("\"{}\" is", masks[0])
                                : fmt::format("the {} keys \"{}\" ... \"{}\" are", masks.size(),
                                              masks.front(), masks.back());
  return fmt::format(
      "\n  ({} the causal mask that nanoGPT keeps as a buffer when it runs without flash "
      "attention (and Hugging Face's GPT-2 always): a constant lower-triangular matrix, not a "
      "weight; this model's attention makes its own. Erase {} from the state_dict "
      "(dict.erase(key)), as nanoGPT's from_pretrained drops them{})",
      which, masks.size() == 1 ? "it" : "them",
      masks.size() == r.unexpected_keys.size() ? ", or load with strict=false" : "");
}

// For a GPT's position embeddings ("<...>wpe.weight", [block_size, C]) whose
// shape mismatch is a longer table than the model's: the dict was saved with a
// larger block_size (GPT-2's 1024), and its first rows are this model's, as
// nanoGPT's crop_block_size keeps them. `src` and `dst` have the same width.
std::string position_crop_hint(const std::string& name, const Tensor& src, const Tensor& dst) {
  const bool wpe = name == "wpe.weight" || name.ends_with(".wpe.weight");
  if (!wpe || src.dim() != 2 || dst.dim() != 2 || src.size(1) != dst.size(1) ||
      src.size(0) <= dst.size(0))
    return "";
  const int64_t rows = dst.size(0);
  return fmt::format(
      "\n  ({} holds position embeddings for {} positions, and this model's block_size is {}: "
      "to run the model at the shorter context, keep the first {} rows, as nanoGPT's "
      "crop_block_size does (erase the key and insert dict.at(\"{}\").slice(0, 0, {}) under "
      "it); for the full context, build the model with block_size {})",
      name, src.size(0), rows, rows, name, rows, src.size(0));
}

// For a GPT's token embeddings ("<...>wte.weight", [vocab_size, C]; the tied
// lm_head's mismatch says nothing more) of another vocabulary size at the
// same width: nanoGPT
// pads GPT-2's 50257 tokens to 50304 (a multiple of 64) when it trains from
// scratch, so its checkpoints have 50304 rows.
std::string vocab_size_hint(const std::string& name, const Tensor& src, const Tensor& dst) {
  const bool embedding = name == "wte.weight" || name.ends_with(".wte.weight");
  if (!embedding || src.dim() != 2 || dst.dim() != 2 || src.size(1) != dst.size(1) ||
      src.size(0) == dst.size(0))
    return "";
  return fmt::format(
      "\n  ({} holds {} token embeddings, and this model's vocab_size is {}: build the model "
      "with vocab_size {}{})",
      name, src.size(0), dst.size(0), src.size(0),
      src.size(0) == 50304 ? " (nanoGPT pads GPT-2's 50257 tokens to 50304 when it trains "
                             "from scratch)"
                           : "");
}

// Everything load_state_dict checks, against the model's own state_dict
// `own`: throws its error, or returns what a load would skip.
LoadResult check_against(const Module& model, const StateDict& own, const StateDict& dict,
                         bool strict) {
  const auto& items = own.items();
  const std::vector<std::vector<size_t>> twins = twins_of(own);
  std::unordered_set<std::string> optional;
  collect_optional(model, "", optional);
  LoadResult result;
  std::vector<std::string> mismatches, mismatched_names, untied, shape_hints;
  size_t transposed = 0;  // mismatches that are the model's 2-D shape reversed
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& [name, dst] = items[i];
    const Tensor* src = dict.find(name);
    // A tied tensor is loaded by any of its names: safetensors' save_model
    // and HF's save_pretrained write only one of them.
    const auto twin_in_dict = [&] {
      return std::any_of(twins[i].begin(), twins[i].end(),
                         [&](size_t j) { return dict.contains(items[j].first); });
    };
    if (src == nullptr) {
      if (!twin_in_dict() && !optional.contains(name)) result.missing_keys.push_back(name);
    } else if (!src->defined() || src->shape() != dst.shape()) {
      mismatches.push_back(fmt::format(
          "size mismatch for {}: copying a tensor with shape {} from the state_dict, the shape "
          "in the current model is {}",
          name, src->defined() ? runtime::shape_str(src->shape()) : "(undefined)",
          runtime::shape_str(dst.shape())));
      mismatched_names.push_back(name);
      transposed += src->defined() && src->dim() == 2 && dst.dim() == 2 &&
                    src->size(0) == dst.size(1) && src->size(1) == dst.size(0);
      if (src->defined()) {
        for (std::string hint : {position_crop_hint(name, *src, dst),
                                 vocab_size_hint(name, *src, dst)}) {
          if (!hint.empty()) shape_hints.push_back(std::move(hint));
        }
      }
    } else {
      // Two names of one tensor with different values: the dict comes from
      // a model where they are separate, and one of them would be lost.
      for (size_t j : twins[i]) {
        const Tensor* other = dict.find(items[j].first);
        if (j < i || other == nullptr || !other->defined() || other->shape() != dst.shape() ||
            same_values_for(dst, *src, *other))
          continue;
        untied.push_back(fmt::format(
            "{} and {} are one tensor in this model (tied), but the state_dict holds different "
            "values for them: it was saved from a model where they are separate; load only the "
            "one to keep (erase the other from the state_dict)",
            name, items[j].first));
      }
    }
  }
  for (const auto& [name, t] : dict)
    if (!own.contains(name)) result.unexpected_keys.push_back(name);

  // Shape mismatches are errors even when not strict (as in PyTorch).
  std::vector<std::string> errors;
  if (strict && !result.missing_keys.empty())
    errors.push_back("missing key(s) in state_dict: " + quoted_list(result.missing_keys));
  if (strict && !result.unexpected_keys.empty())
    errors.push_back("unexpected key(s) in state_dict: " + quoted_list(result.unexpected_keys));
  errors.insert(errors.end(), mismatches.begin(), mismatches.end());
  errors.insert(errors.end(), untied.begin(), untied.end());
  if (!errors.empty()) {
    std::string msg = fmt::format("error(s) in loading state_dict for {} (nothing was loaded):",
                                  model.type_name());
    for (const auto& e : errors) msg += "\n  " + e;
    // Hugging Face's GPT-2 keeps its projections in Conv1D, [in, out]: a square
    // one loads without a mismatch, transposed, so all of them must be turned.
    if (transposed != 0 && transposed == mismatches.size())
      msg += "\n  (each is the transpose of the model's shape: the weights were saved [in, "
             "out], as Hugging Face's Conv1D (GPT-2) stores them, and this model's Linear "
             "holds [out, in], as torch.nn.Linear and nanoGPT; transpose every such weight, "
             "the square ones too, which no shape check catches)";
    for (const auto& hint : shape_hints) msg += hint;
    // Fine-tuning's usual case: pretrained weights whose classifier head has
    // another number of classes than the model's new one.
    if (!mismatched_names.empty() && shape_hints.empty() && transposed != mismatches.size())
      msg += fmt::format(
          "\n  (to load the other weights and keep this model's own {} (a classifier head of "
          "another size, replaced for fine-tuning), erase {} from the state_dict "
          "(dict.erase(key)) and load with strict=false)",
          quoted_list(mismatched_names), mismatched_names.size() == 1 ? "it" : "them");
    if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty()))
      msg += prefix_hint(result) + causal_mask_hint(own, result) +
             "\n  (pass strict=false to load the matching keys and ignore the others)";
    throw Error(msg);
  }
  return result;
}

}  // namespace

LoadResult Module::check_state_dict(const StateDict& dict, bool strict) const {
  return check_against(*this, state_dict(), dict, strict);
}

LoadResult Module::load_state_dict(const StateDict& dict, bool strict) {
  const StateDict own = state_dict();
  LoadResult result = check_against(*this, own, dict, strict);

  // A source may share memory with what is written: the model's own tensors
  // (a view of one parameter loaded into another, a transposed copy of the
  // destination itself). Writing one destination could then change a source
  // read later, or copy_ refuse the overlap after earlier keys were copied.
  // Such sources are cloned first, so that every value is read as the dict
  // held it and the copies below cannot fail halfway. A source that is its
  // destination exactly (a model's own state_dict loaded back) writes
  // nothing and needs no clone.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  std::unordered_set<const runtime::Storage*> written;
  for (const auto& [name, dst] : own) {
    const Tensor* src = dict.find(name);
    if (src == nullptr || same_view(*src, dst)) continue;
    copies.emplace_back(dst, *src);
    written.insert(dst.storage().get());
  }
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies)
    if (written.count(src.storage().get()) != 0) src = src.clone();
  for (auto& [dst, src] : copies) dst.copy_(src);  // dst: a detached handle on the model's storage
  return result;
}

}  // namespace lockstep::nn
