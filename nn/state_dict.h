// StateDict: name -> tensor in insertion order, like the OrderedDict that
// PyTorch's state_dict() returns. Module::state_dict() fills it with dotted
// names ("features.0.weight"); checkpoints store and load it as is.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

class StateDict {
 public:
  using Item = std::pair<std::string, runtime::Tensor>;

  StateDict() = default;
  // From (name, tensor) pairs, e.g. as read from a checkpoint; names must be unique.
  explicit StateDict(std::vector<Item> items);

  // Appends; a name that is already present is an error.
  void insert(std::string name, runtime::Tensor value);
  bool contains(std::string_view name) const;
  // Null when absent.
  const runtime::Tensor* find(std::string_view name) const;
  // Error naming the key when absent.
  const runtime::Tensor& at(std::string_view name) const;
  // Removes a key (keeping the order of the rest); returns whether it was there.
  bool erase(std::string_view name);

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> keys() const;
  // A copy without `prefix` at the start of the names that have it, as
  // PyTorch's consume_prefix_in_state_dict_if_present: loads a state_dict
  // saved from a DistributedDataParallel or DataParallel wrapper ("module.")
  // into the bare model. Throws if two names become one.
  StateDict without_prefix(std::string_view prefix) const;
  // Only the names that start with `prefix`, without it: one part of a
  // larger dict, such as a training checkpoint's model ("model.").
  StateDict under(std::string_view prefix) const;
  // A copy with `prefix` in front of every name: loads a state_dict saved
  // without the name its model has inside this one (Hugging Face's GPT2Model
  // into a GPT whose blocks sit under "transformer.").
  StateDict with_prefix(std::string_view prefix) const;
  // In order, e.g. for a checkpoint writer (the runtime layer cannot see nn types).
  const std::vector<Item>& items() const { return items_; }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in items_
};

}  // namespace lockstep::nn
