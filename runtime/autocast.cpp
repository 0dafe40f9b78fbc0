#include "lockstep/runtime/autocast.h"

#include <span>
#include <unordered_map>

#include <fmt/format.h>

#include "lockstep/runtime/autograd/detail/checkpoint_region.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

namespace {

thread_local AutocastState t_state;
thread_local int t_open_scopes = 0;  // enabled scopes; the cache lives while > 0

// Casts of parameters (leaves that require grad) in the open scopes, keyed by
// the parameter's storage and view, so one forward casts each weight once. A
// hit must be the same tensor (two leaves may share a storage, and a cast's
// gradient flows to its own source), at the same version (a parameter
// changed in place since is cast again).
struct CachedCast {
  Tensor source;
  // The key's storage, kept alive: Module::to rebinds a parameter to a new
  // storage, and one made after the old was freed may take its address.
  std::shared_ptr<Storage> storage;
  uint64_t version;
  bool grad_mode;
  Tensor cast;
};
struct CastKey {
  const void* storage;
  int64_t offset;
  DType dtype;
  bool operator==(const CastKey&) const = default;
};
struct CastKeyHash {
  size_t operator()(const CastKey& k) const {
    return std::hash<const void*>()(k.storage) ^ (std::hash<int64_t>()(k.offset) * 31) ^
           (static_cast<size_t>(k.dtype) << 7);
  }
};
thread_local std::unordered_map<CastKey, CachedCast, CastKeyHash> t_cache;

// A checkpoint's recomputation in backward neither reads nor fills the cache:
// its casts hang from a graph that is not differentiable, and the next
// forward in the scope must not pick them up.
bool recomputing() {
  const ActiveRegion* region = active_checkpoint();
  return region != nullptr && region->recomputing;
}

Tensor cast(const Tensor& t, DType dtype) {
  if (!(t.is_leaf() && t.requires_grad()) || recomputing()) return t.to(dtype);
  const CastKey key{t.storage().get(), t.storage_offset(), dtype};
  const uint64_t version = t.storage()->version();
  auto it = t_cache.find(key);
  if (it != t_cache.end() && it->second.source.is_same(t) &&
      it->second.storage == t.storage() && it->second.version == version &&
      it->second.grad_mode == grad_enabled()) {
    // A checkpoint region's forward reads the parameter through a cast made
    // earlier, but its recomputation casts it anew: note the read, as the
    // cast op records it on a miss, so a step before backward is refused.
    const ActiveRegion* region = active_checkpoint();
    if (region != nullptr && grad_enabled()) region->region->note_inputs("ToDTypeBackward", {t});
    return it->second.cast;
  }
  Tensor c = t.to(dtype);
  t_cache[key] = CachedCast{t, t.storage(), version, grad_enabled(), c};
  return c;
}

// Whether autocast casts `t` to `target`: floating and not yet there. f64
// stays f64, as in PyTorch (a user who asked for f64 keeps it).
bool eligible(const Tensor& t, DType target) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::f64 && t.dtype() != target;
}

}  // namespace

AutocastState autocast_state() { return t_state; }

AutocastGuard::AutocastGuard(const AutocastState& state) : previous_(t_state) {
  t_state = state;
  if (state.enabled) ++t_open_scopes;
}

AutocastGuard::~AutocastGuard() {
  if (t_state.enabled && --t_open_scopes == 0) t_cache.clear();
  t_state = previous_;
}

AutocastGuard autocast(const AutocastOptions& options) {
  LOCKSTEP_CHECK(options.dtype == DType::bf16 || options.dtype == DType::f16,
                 "autocast: dtype {} is not a lower-precision float; use DType::bf16 or DType::f16",
                 dtype_name(options.dtype));
  return AutocastGuard(AutocastState{options.enabled, options.dtype, options.device});
}

namespace detail {

namespace {

// The dtype `policy` runs an op at, given its floating inputs.
DType policy_dtype(CastPolicy policy, const AutocastState& s, std::span<const Tensor> inputs) {
  if (policy == CastPolicy::lower) return s.dtype;
  if (policy == CastPolicy::f32) return DType::f32;
  std::optional<DType> widest;
  for (const Tensor& t : inputs) {
    if (!t.defined() || !is_floating(t.dtype())) continue;
    widest = widest ? promote_types(*widest, t.dtype()) : t.dtype();
  }
  return widest.value_or(DType::f32);
}

std::optional<std::vector<Tensor>> cast_inputs(CastPolicy policy, std::span<const Tensor> inputs) {
  const AutocastState& s = t_state;
  if (!s.enabled) return std::nullopt;
  const DType target = policy_dtype(policy, s, inputs);
  bool applies = false, changes = false;
  for (const Tensor& t : inputs) {
    if (!t.defined() || !is_floating(t.dtype())) continue;
    if (!applies && !s.applies_to(t.device())) return std::nullopt;
    applies = true;
    if (eligible(t, target)) changes = true;
  }
  if (!changes) return std::nullopt;
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    out.push_back(eligible(t, target) ? cast(t, target) : t);
  }
  return out;
}

}  // namespace

std::optional<std::vector<Tensor>> autocast_inputs(CastPolicy policy,
                                                   std::initializer_list<Tensor> inputs) {
  return cast_inputs(policy, {inputs.begin(), inputs.size()});
}

std::optional<std::vector<Tensor>> autocast_inputs(CastPolicy policy,
                                                   const std::vector<Tensor>& inputs) {
  return cast_inputs(policy, inputs);
}

}  // namespace detail

}  // namespace lockstep::runtime
