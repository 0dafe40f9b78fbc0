#include "lockstep/optim/zero_state_transfer.h"

#include <sstream>

#include "lockstep/runtime/error.h"

namespace lockstep::optim::zero_detail {

using runtime::DType;

namespace {
constexpr const char* kName = "ZeroRedundancyOptimizer";
}  // namespace

std::string describe_entries(const std::vector<EntryInfo>& entries) {
  std::ostringstream out;
  for (const auto& e : entries) {
    out << e.param << ' ' << e.begin << ' ' << e.end << ' ' << e.key << ' '
        << static_cast<int>(e.dtype) << ' ' << e.shape.size();
    for (int64_t d : e.shape) out << ' ' << d;
    out << '\n';
  }
  return out.str();
}

std::vector<EntryInfo> parse_entries(const std::string& text) {
  std::vector<EntryInfo> out;
  std::istringstream in(text);
  EntryInfo e;
  int dtype = 0;
  size_t dims = 0;
  while (in >> e.param >> e.begin >> e.end >> e.key >> dtype >> dims) {
    e.dtype = static_cast<DType>(dtype);
    e.shape.assign(dims, 0);
    for (auto& d : e.shape) in >> d;
    out.push_back(e);
  }
  return out;
}

void Stitcher::add(const EntryInfo& e, const Tensor& value) {
  const Tensor& p = params_[static_cast<size_t>(e.param)];
  Tensor& slot = full_.state[e.param][e.key];
  if (e.begin == 0 && e.end == p.numel()) {
    slot = value.clone();
    return;
  }
  if (value.dim() == 0) {
    if (!slot.defined()) slot = value.clone();
    return;
  }
  LOCKSTEP_CHECK(value.numel() == e.end - e.begin,
                 "{}.consolidate_state_dict: state \"{}\" of the piece [{}, {}) of parameter {} "
                 "has shape {}, neither one element per parameter element nor 0-dim; the inner "
                 "optimizer is not elementwise: pass split_parameters = false",
                 kName, e.key, e.begin, e.end, e.param, runtime::shape_str(value.shape()));
  if (!slot.defined()) slot = Tensor::zeros(p.shape(), value.dtype(), value.device());
  slot.view({-1}).slice(0, e.begin, e.end).copy_(value.reshape({-1}));
  covered_[{e.param, e.key}] += e.end - e.begin;
}

void Stitcher::check_complete() const {
  for (const auto& [where, count] : covered_) {
    const int64_t numel = params_[static_cast<size_t>(where.first)].numel();
    LOCKSTEP_CHECK(count == numel,
                   "{}.consolidate_state_dict: state \"{}\" of parameter {} came for {} of its "
                   "{} elements",
                   kName, where.second, where.first, count, numel);
  }
}

}  // namespace lockstep::optim::zero_detail
