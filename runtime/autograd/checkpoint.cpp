#include "lockstep/runtime/autograd/checkpoint.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/runtime/autograd/detail/checkpoint_region.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

namespace {

thread_local ActiveRegion* t_active = nullptr;

// Makes `region` this thread's active region until destroyed.
class ActiveScope {
 public:
  ActiveScope(std::shared_ptr<CheckpointRegion> region, bool recomputing)
      : active_{std::move(region), recomputing} {
    t_active = &active_;
  }
  ~ActiveScope() { t_active = nullptr; }
  ActiveScope(const ActiveScope&) = delete;
  ActiveScope& operator=(const ActiveScope&) = delete;

 private:
  ActiveRegion active_;
};

// The forward's draws: taken as they would be without it (from the generator,
// or through the log installed before, a DataParallel replica's), and noted.
class RecordDraws final : public detail::DrawLog {
 public:
  explicit RecordDraws(CheckpointRegion& region)
      : region_(region), outer_(detail::current_draw_log()) {}
  uint64_t reserve(Generator& g, uint64_t n) override {
    const uint64_t at = outer_ ? outer_->reserve(g, n) : g.take(n);
    region_.draws.push_back({g.seed(), n, at});
    return at;
  }
  void setting(Generator& g) override {
    if (outer_) outer_->setting(g);
  }
  void destroying(Generator& g) override {
    if (outer_) outer_->destroying(g);
  }

 private:
  CheckpointRegion& region_;
  detail::DrawLog* outer_;
};

// The recomputation's draws: the forward's, each generator's in order; the
// generator stays. A draw replays the first one not yet replayed of the same
// seed and size: DataParallel's replicas inside the region take their regions
// of different generators (one each replica makes) in whatever order their
// threads get there, in the forward and again here.
class ReplayDraws final : public detail::DrawLog {
 public:
  explicit ReplayDraws(const std::vector<CheckpointRegion::Draw>& draws)
      : draws_(draws), replayed_(draws.size(), false) {}
  uint64_t reserve(Generator& g, uint64_t n) override {
    size_t k = next_;
    while (k < draws_.size() && (replayed_[k] || draws_[k].n != n || draws_[k].seed != g.seed()))
      ++k;
    if (k == draws_.size()) {  // none matches: name how the next one differs
      LOCKSTEP_CHECK(next_ < draws_.size() && draws_[next_].n == n,
                     "checkpoint: the recomputation drew random numbers differently from the "
                     "forward (draw {} of {}): the checkpointed function must draw the same "
                     "numbers from the same generators each time it runs",
                     next_ + 1, draws_.size());
      LOCKSTEP_CHECK(false,
                     "checkpoint: draw {} of the recomputation came from a generator of seed "
                     "{}, in the forward from one of seed {}: re-seed no generator between the "
                     "forward and the backward of a checkpointed region, and seed one the "
                     "checkpointed function creates the same way each time it runs",
                     next_ + 1, g.seed(), draws_[next_].seed);
    }
    replayed_[k] = true;
    ++count_;
    while (next_ < draws_.size() && replayed_[next_]) ++next_;
    return draws_[k].at;
  }
  bool finished() const { return count_ == draws_.size(); }

  // A generator the function seeds or positions (manual_seed inside it) is
  // put back as it was before the recomputation, as PyTorch's fork_rng does,
  // so the replay leaves it where the forward left it; one the function
  // created itself is gone by then.
  void setting(Generator& g) override {
    for (const Before& b : before_)
      if (b.generator == &g) return;
    before_.push_back({&g, g.seed(), g.offset()});
  }
  void destroying(Generator& g) override {
    std::erase_if(before_, [&g](const Before& b) { return b.generator == &g; });
  }
  // Call with this log no longer installed.
  void restore() {
    for (const Before& b : before_) {
      b.generator->manual_seed(b.seed);
      b.generator->set_offset(b.offset);
    }
    before_.clear();
  }

 private:
  struct Before {
    Generator* generator;
    uint64_t seed, offset;
  };
  const std::vector<CheckpointRegion::Draw>& draws_;
  std::vector<bool> replayed_;
  size_t next_ = 0;   // the first draw not yet replayed
  size_t count_ = 0;  // draws replayed
  std::vector<Before> before_;
};

// Records in the recomputation only mark their outputs as requiring grad.
class RecomputedNode final : public Node {
 public:
  explicit RecomputedNode(const char* name) : Node(name) {}
  std::vector<Tensor> apply(const Tensor&) override {
    LOCKSTEP_CHECK(false, "{}: a checkpoint recomputation's graph is not differentiable",
                   name());
    return {};
  }
};

}  // namespace

ActiveRegion* active_checkpoint() { return t_active; }
bool in_checkpoint() { return t_active != nullptr; }
bool in_checkpoint_recomputation() { return t_active != nullptr && t_active->recomputing; }

std::shared_ptr<Node> recomputed_node(const char* op) {
  return std::make_shared<RecomputedNode>(op);
}

CheckpointRegion::CheckpointRegion(CheckpointFn fn, const std::vector<Tensor>& inputs)
    : fn_(std::move(fn)), autocast_(autocast_state()) {
  for (const Tensor& t : inputs) {
    inputs_.push_back(t.defined() ? t.detach() : Tensor());
    input_requires_grad_.push_back(t.defined() && t.requires_grad());
    input_versions_.push_back(t.defined() ? t.version() : 0);
  }
}

size_t CheckpointRegion::add_slots(const char* op, const std::vector<Tensor>& saved) {
  const size_t first = slot_ops_.size();
  slot_ops_.insert(slot_ops_.end(), saved.size(), op);
  for (const Tensor& t : saved) {
    if (t.defined())
      slot_origins_.push_back({t.storage(), t.version(), t.shape()});
    else
      slot_origins_.emplace_back();
  }
  return first;
}

void CheckpointRegion::note_inputs(const char* op, const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (t.is_leaf() && t.requires_grad()) {
      read_parameters_.push_back({op, t.storage(), t.version(), t.shape()});
      continue;
    }
    // A storage freed in the forward may come back at the same address.
    ReadParameter& read = reads_[t.storage().get()];
    if (read.storage.lock() != t.storage()) read = {op, t.storage(), t.version(), t.shape()};
  }
}

void CheckpointRegion::forward_done() {
  for (auto it = reads_.begin(); it != reads_.end();) {
    const std::shared_ptr<Storage> storage = it->second.storage.lock();
    if (storage == nullptr || storage.get() != it->first) {  // an activation, freed
      it = reads_.erase(it);
      continue;
    }
    it->second.version = storage->version();
    ++it;
  }
}

void CheckpointRegion::check_reads(const char* op, const std::vector<Tensor>& inputs) const {
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    const auto it = reads_.find(t.storage().get());
    if (it == reads_.end() || it->second.storage.lock() != t.storage()) continue;
    LOCKSTEP_CHECK(t.version() == it->second.version,
                   "checkpoint: a tensor (shape {}) that {} read in a checkpointed forward, not "
                   "an input of the region (the function captures it), was modified by an "
                   "in-place operation before backward: it is at version {}, expected version "
                   "{}. The recomputation ({} now) would read the new values and return the "
                   "gradient of a loss the forward never computed; change it after backward, "
                   "pass it to checkpoint() as an input, or give the function a clone() of it.",
                   shape_str(it->second.shape), it->second.op, t.version(), it->second.version,
                   op);
  }
}

void CheckpointRegion::collect(const char* op, const std::vector<Tensor>& saved) {
  for (const Tensor& t : saved) {
    const size_t slot = collected_++;
    LOCKSTEP_CHECK(slot < slot_ops_.size() && std::strcmp(slot_ops_[slot], op) == 0,
                   "checkpoint: the recomputation recorded a different graph from the forward: "
                   "saved tensor {} comes from {} now, from {} in the forward (the forward saved "
                   "{} tensors). The checkpointed function must run the same ops each time.",
                   slot, op, slot < slot_ops_.size() ? slot_ops_[slot] : "nothing",
                   slot_ops_.size());
    if (!released_[slot]) saved_[slot] = SavedTensor(t);
  }
}

void CheckpointRegion::recompute() {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    LOCKSTEP_CHECK(!inputs_[i].defined() || inputs_[i].version() == input_versions_[i],
                   "checkpoint: input {} of a checkpointed region was modified in place after "
                   "the region ran (version {}, expected {}); the recomputation needs it "
                   "unchanged. clone() it before changing it, or change it outside the region.",
                   i, inputs_[i].version(), input_versions_[i]);
  }
  for (const ReadParameter& p : read_parameters_) {
    const std::shared_ptr<Storage> storage = p.storage.lock();
    LOCKSTEP_CHECK(!storage || storage->version() == p.version,
                   "checkpoint: a parameter (shape {}) that {} read in a checkpointed forward "
                   "was modified by an in-place operation before backward: it is at version "
                   "{}, expected version {}. The recomputation would read the new values and "
                   "return the gradient of a loss the forward never computed; step the "
                   "optimizer after backward, or clone() the tensor before changing it.",
                   shape_str(p.shape), p.op, storage->version(), p.version);
  }
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    Tensor t = inputs_[i].defined() ? inputs_[i].detach() : Tensor();
    if (input_requires_grad_[i]) t.requires_grad_(true);
    inputs.push_back(std::move(t));
  }
  saved_.assign(slot_ops_.size(), SavedTensor());
  if (released_.size() < slot_ops_.size()) released_.resize(slot_ops_.size(), false);
  collected_ = 0;
  {
    ReplayDraws replay(draws);
    const bool grad_was = grad_enabled();
    set_grad_enabled(true);
    struct RestoreGrad {
      bool on;
      ~RestoreGrad() { set_grad_enabled(on); }
    } restore{grad_was};
    AutocastGuard autocast(autocast_);
    ActiveScope active(shared_from_this(), true);
    struct RestoreGenerators {
      ReplayDraws& replay;
      ~RestoreGenerators() { replay.restore(); }
    } restore_generators{replay};  // after the log below is gone, even on a throw
    detail::DrawLogScope log(&replay);
    fn_(inputs);  // the outputs and the graph behind them are dropped here
    LOCKSTEP_CHECK(replay.finished(),
                   "checkpoint: the recomputation drew fewer random numbers than the forward; "
                   "the checkpointed function must draw the same numbers each time it runs");
  }
  LOCKSTEP_CHECK(collected_ == slot_ops_.size(),
                 "checkpoint: the recomputation saved {} tensors for backward, the forward {}; "
                 "the checkpointed function must run the same ops each time",
                 collected_, slot_ops_.size());
  recomputed_ = true;
  // Everything backward needs is in saved_ now.
  fn_ = nullptr;
  inputs_.clear();
  read_parameters_.clear();
  reads_.clear();
}

// As SavedTensor::unpack without a region: a tensor the forward saved that
// was changed in place since (a parameter updated between forward and
// backward) is an error, not a recomputation from its new values, whose
// gradient would not be the gradient of the loss the forward computed.
void CheckpointRegion::check_unchanged(size_t slot, const Node& owner, size_t index) const {
  const SlotOrigin& origin = slot_origins_[slot];
  const std::shared_ptr<Storage> storage = origin.storage.lock();
  LOCKSTEP_CHECK(!storage || storage->version() == origin.version,
                 "{}: saved tensor {} (shape {}) needed for the gradient was modified by an "
                 "in-place operation after the checkpointed forward: it is at version {}, "
                 "expected version {}. Use an out-of-place op, or clone() the tensor before "
                 "changing it.",
                 owner.name(), index, shape_str(origin.shape), storage ? storage->version() : 0,
                 origin.version);
}

Tensor CheckpointRegion::unpack(size_t slot, const Node& owner, size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recomputed_) recompute();  // first: its own check names a changed input
  check_unchanged(slot, owner, index);
  return saved_[slot].unpack(owner, index);
}

void CheckpointRegion::release(size_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (released_.size() < slot_ops_.size()) released_.resize(slot_ops_.size(), false);
  released_[slot] = true;
  if (slot < saved_.size()) saved_[slot] = SavedTensor();
}

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  LOCKSTEP_CHECK(fn != nullptr, "checkpoint: the function is empty");
  LOCKSTEP_CHECK(!in_checkpoint(),
                 "checkpoint: checkpoint regions do not nest; checkpoint the outer function or "
                 "the inner ones, not both");
  if (!grad_enabled()) return fn(inputs);
  auto region = std::make_shared<CheckpointRegion>(fn, inputs);
  RecordDraws record(*region);
  ActiveScope active(region, false);
  detail::DrawLogScope log(&record);
  std::vector<Tensor> outputs = fn(inputs);
  region->forward_done();
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  LOCKSTEP_CHECK(fn != nullptr, "checkpoint: the function is empty");
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    {input})[0];
}

}  // namespace lockstep::runtime
