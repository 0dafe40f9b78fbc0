#include "lockstep/nn/values.h"

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::nn {

using runtime::Tensor;

std::string describe(const Value& v) {
  struct Describe {
    std::string operator()(std::monostate) const { return "none"; }
    std::string operator()(const Tensor& t) const {
      if (!t.defined()) return "an undefined tensor";
      return fmt::format("a tensor {} {}", runtime::shape_str(t.shape()),
                         runtime::dtype_name(t.dtype()));
    }
    std::string operator()(bool b) const { return fmt::format("the flag {}", b); }
    std::string operator()(int64_t i) const { return fmt::format("the integer {}", i); }
    std::string operator()(double d) const { return fmt::format("the number {}", d); }
    std::string operator()(const std::string& s) const { return fmt::format("the text \"{}\"", s); }
  };
  return std::visit(Describe{}, v);
}

namespace {

template <class T>
const T& get_at(const std::vector<Value>& values, size_t i, const char* wanted) {
  LOCKSTEP_CHECK(i < values.size(), "expected {} at position {} but only {} values were given",
                 wanted, i, values.size());
  const T* p = std::get_if<T>(&values[i]);
  LOCKSTEP_CHECK(p != nullptr, "expected {} at position {} but it holds {}", wanted, i,
                 describe(values[i]));
  return *p;
}

}  // namespace

const Value& Values::operator[](size_t i) const {
  LOCKSTEP_CHECK(i < values_.size(),
                 "expected a value at position {} but only {} values were given", i,
                 values_.size());
  return values_[i];
}

bool Values::is_tensor(size_t i) const {
  const Tensor* t = i < values_.size() ? std::get_if<Tensor>(&values_[i]) : nullptr;
  return t != nullptr && t->defined();
}

const Tensor& Values::tensor(size_t i) const {
  const Tensor& t = get_at<Tensor>(values_, i, "a tensor");
  LOCKSTEP_CHECK(t.defined(), "expected a tensor at position {} but it is undefined", i);
  return t;
}

bool Values::flag(size_t i) const { return get_at<bool>(values_, i, "a flag (bool)"); }

int64_t Values::integer(size_t i) const { return get_at<int64_t>(values_, i, "an integer"); }

double Values::number(size_t i) const {
  if (i < values_.size()) {
    if (const auto* n = std::get_if<int64_t>(&values_[i])) return static_cast<double>(*n);
  }
  return get_at<double>(values_, i, "a number");
}

const std::string& Values::text(size_t i) const {
  return get_at<std::string>(values_, i, "a string");
}

Tensor Values::optional_tensor(size_t i) const {
  if (i >= values_.size() || std::holds_alternative<std::monostate>(values_[i])) return {};
  return get_at<Tensor>(values_, i, "a tensor or none");
}

std::vector<Tensor> Values::tensors() const {
  std::vector<Tensor> out;
  for (const Value& v : values_) {
    if (const auto* t = std::get_if<Tensor>(&v); t != nullptr && t->defined()) out.push_back(*t);
  }
  return out;
}

}  // namespace lockstep::nn
