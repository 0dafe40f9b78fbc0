#include "lockstep/nn/state_dict.h"

#include "lockstep/runtime/error.h"

namespace lockstep::nn {

StateDict::StateDict(std::vector<Item> items) {
  for (auto& [name, t] : items) insert(std::move(name), std::move(t));
}

void StateDict::insert(std::string name, runtime::Tensor value) {
  LOCKSTEP_CHECK(!index_.contains(name), "StateDict: key \"{}\" is already present", name);
  index_.emplace(name, items_.size());
  items_.emplace_back(std::move(name), std::move(value));
}

bool StateDict::contains(std::string_view name) const { return find(name) != nullptr; }

const runtime::Tensor* StateDict::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const runtime::Tensor& StateDict::at(std::string_view name) const {
  const runtime::Tensor* t = find(name);
  LOCKSTEP_CHECK(t != nullptr, "StateDict: no key \"{}\" (it holds {} keys)", name, size());
  return *t;
}

bool StateDict::erase(std::string_view name) {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return false;
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
  return true;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& [name, t] : items_) out.push_back(name);
  return out;
}

StateDict StateDict::without_prefix(std::string_view prefix) const {
  StateDict out;
  for (const auto& [name, t] : items_) {
    const bool has = std::string_view(name).starts_with(prefix);
    const std::string stripped = has ? name.substr(prefix.size()) : name;
    LOCKSTEP_CHECK(!out.contains(stripped),
                   "StateDict::without_prefix(\"{}\"): \"{}\" would become \"{}\", a key "
                   "already there",
                   prefix, name, stripped);
    out.insert(stripped, t);
  }
  return out;
}

StateDict StateDict::under(std::string_view prefix) const {
  StateDict out;
  for (const auto& [name, t] : items_)
    if (std::string_view(name).starts_with(prefix)) out.insert(name.substr(prefix.size()), t);
  return out;
}

StateDict StateDict::with_prefix(std::string_view prefix) const {
  StateDict out;
  for (const auto& [name, t] : items_) out.insert(std::string(prefix) + name, t);
  return out;
}

}  // namespace lockstep::nn
