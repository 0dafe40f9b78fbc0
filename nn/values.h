// Values: the arguments of a module's call, or what it returns, when that is
// more than one tensor (tokens and targets in; logits and loss out; a flag).
//
//   nn::Values out = (*gpt)({tokens, targets});
//   Tensor loss = out.tensor(1);
//
// A positional list; each value is a tensor, an absent one (none), a flag,
// an integer, a real number or a string. Typed access names the position
// and what is there when it is not what was asked for.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

// std::monostate is "none" (PyTorch's None).
using Value = std::variant<std::monostate, runtime::Tensor, bool, int64_t, double, std::string>;

class Values {
 public:
  Values() = default;
  Values(std::initializer_list<Value> values) : values_(values) {}
  explicit Values(std::vector<Value> values) : values_(std::move(values)) {}

  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  // An error naming i and the count when i is past the end.
  const Value& operator[](size_t i) const;
  void push_back(Value v) { values_.push_back(std::move(v)); }
  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }

  bool is_tensor(size_t i) const;  // a defined tensor at i
  // The value at i as that type; an error naming i and what is there.
  const runtime::Tensor& tensor(size_t i) const;
  bool flag(size_t i) const;
  int64_t integer(size_t i) const;
  double number(size_t i) const;  // a double, or an integer converted
  const std::string& text(size_t i) const;
  // The tensor at i, or an undefined one where i is past the end or none:
  // for trailing optional arguments.
  runtime::Tensor optional_tensor(size_t i) const;

  // Every defined tensor, in order.
  std::vector<runtime::Tensor> tensors() const;

 private:
  std::vector<Value> values_;
};

// "tensor [2, 3] f32", "none", "flag true", ...: for error messages.
std::string describe(const Value& v);

}  // namespace lockstep::nn
