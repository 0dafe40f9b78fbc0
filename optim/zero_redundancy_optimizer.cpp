#include "lockstep/optim/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>

#include "lockstep/collectives/rank_text.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/zero_state_transfer.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

namespace lockstep::optim {

using collectives::ReduceOp;
using collectives::Work;
using runtime::DType;
using runtime::NoGradGuard;
using namespace zero_detail;

namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";

int64_t bytes_of(const Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

// A unit of parameter sync. Broadcast: `root`'s pieces, packed into `buffer`
// or (`direct`) sent from the parameter itself. Allgather: every rank's pieces
// of one dtype; rank r's slot is buffer[r*slot, (r+1)*slot) and `input` is
// this rank's slot before the gather.
struct ZeroRedundancyOptimizer::Bucket {
  int root = -1;  // -1: all-gather
  bool direct = false;
  std::vector<size_t> pieces;    // into partition_.pieces
  std::vector<int64_t> offsets;  // element offset of each in `buffer`
  Tensor buffer, input;
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 std::shared_ptr<collectives::ProcessGroup> group,
                                                 OptimizerFactory factory, ZeroOptions options)
    : ZeroRedundancyOptimizer(std::vector<ParamGroup>{{std::move(params), {}}}, std::move(group),
                              std::move(factory), options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<ParamGroup> groups,
                                                 std::shared_ptr<collectives::ProcessGroup> group,
                                                 OptimizerFactory factory, ZeroOptions options)
    : Optimizer(kName, {}), group_(std::move(group)), factory_(std::move(factory)), options_(options) {
  LOCKSTEP_CHECK(group_ != nullptr, "{}: got no process group", kName);
  LOCKSTEP_CHECK(static_cast<bool>(factory_), "{}: got no optimizer factory", kName);
  LOCKSTEP_CHECK(!groups.empty(), "{}: got an empty list of parameter groups", kName);
  LOCKSTEP_CHECK(std::isfinite(options_.bucket_cap_mb) && options_.bucket_cap_mb > 0,
                 "{}: bucket_cap_mb {} must be a finite number > 0", kName,
                 options_.bucket_cap_mb);
  std::unordered_set<const runtime::TensorImpl*> seen;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& p = groups[g].params[i];
      LOCKSTEP_CHECK(p.defined() && runtime::is_floating(p.dtype()) && p.is_leaf(),
                     "{}: parameter {} of group {} must be a defined floating-point leaf tensor",
                     kName, i, g);
      LOCKSTEP_CHECK(seen.insert(p.impl_ptr()).second,
                     "{}: parameter {} of group {} appears more than once", kName, i, g);
      all_params_.push_back(p);
      placed_.emplace_back(p.dtype(), p.device());
    }
  }
  // A group of no parameters is kept, as PyTorch's keeps it; no parameters
  // at all is refused, as there.
  LOCKSTEP_CHECK(!all_params_.empty(), "{}: got no parameters (every group is empty)", kName);
  check_same_parameters_on_every_rank(groups);

  // Full options of every group, identical on every rank: from a probe of the
  // inner optimizer's type over one scalar per group (none for an empty one).
  std::vector<ParamGroup> probe_groups;
  for (const auto& g : groups) {
    std::vector<Tensor> scalar;
    if (!g.params.empty()) {
      scalar.push_back(Tensor::zeros({1}, g.params[0].dtype(), g.params[0].device()));
    }
    probe_groups.push_back({std::move(scalar), g.options});
  }
  probe_ = factory_(std::move(probe_groups));
  LOCKSTEP_CHECK(probe_ != nullptr && probe_->param_groups().size() == groups.size(),
                 "{}: the factory must return an optimizer with one group per group given it",
                 kName);
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options = probe_->param_groups()[g].options;
  groups_ = std::move(groups);

  std::vector<int64_t> bytes, numels;
  std::vector<int> dtypes;
  for (const auto& p : all_params_) {
    bytes.push_back(bytes_of(p));
    numels.push_back(p.numel());
    dtypes.push_back(static_cast<int>(p.dtype()));
  }
  partition_ = options_.split_parameters ? partition_elements(numels, dtypes, group_->size())
                                         : partition_parameters(bytes, group_->size(), numels);
  for (const Piece& piece : partition_.pieces) {
    LOCKSTEP_CHECK(is_whole(piece) || all_params_[static_cast<size_t>(piece.param)].is_contiguous(),
                   "{}: parameter {} is not contiguous, so it cannot be cut into pieces; make it "
                   "contiguous or pass split_parameters = false",
                   kName, piece.param);
  }
  build_shard();
  sent_ = changeable();
  plan_sync();
}

// Which parameters step() may change, and so must send: all but the frozen
// ones without a gradient, which the inner optimizer skips as the plain one
// does (a frozen parameter that still holds a gradient is stepped, so sent).
// Every rank freezes alike and holds equal gradients (DDP makes them so),
// so every rank computes the same mask and the same plan.
std::vector<bool> ZeroRedundancyOptimizer::changeable() const {
  std::vector<bool> mask;
  mask.reserve(all_params_.size());
  for (const Tensor& p : all_params_) mask.push_back(p.requires_grad() || p.grad().defined());
  return mask;
}

// This rank's pieces, per original group (pieces and groups both follow the
// global order), and the inner optimizer over them.
void ZeroRedundancyOptimizer::build_shard() {
  NoGradGuard no_grad;  // the views must be leaves
  std::vector<ParamGroup> shard;
  size_t next = 0;  // into partition_.pieces
  int64_t end = 0;  // one past the current group's last global index
  for (size_t g = 0; g < groups_.size(); ++g) {
    end += static_cast<int64_t>(groups_[g].params.size());
    ParamGroup mine{{}, groups_[g].options};
    for (; next < partition_.pieces.size() && partition_.pieces[next].param < end; ++next) {
      const Piece& piece = partition_.pieces[next];
      if (piece.owner != group_->rank()) continue;
      const Tensor& p = all_params_[static_cast<size_t>(piece.param)];
      mine.params.push_back(is_whole(piece) ? p : data_of(piece));
      local_params_.push_back(mine.params.back());
      local_pieces_.push_back(piece);
    }
    if (!mine.params.empty()) {
      shard.push_back(std::move(mine));
      outer_of_inner_.push_back(g);
    }
  }
  if (shard.empty()) return;
  inner_ = factory_(std::move(shard));
  LOCKSTEP_CHECK(inner_ != nullptr && inner_->param_groups().size() == outer_of_inner_.size(),
                 "{}: the factory must return an optimizer with one group per group given it",
                 kName);
}

bool ZeroRedundancyOptimizer::is_whole(const Piece& piece) const {
  return piece.begin == 0 && piece.end == all_params_[static_cast<size_t>(piece.param)].numel();
}

// A piece's elements, sharing the parameter's storage, without history: the
// parameter's shape for a whole piece, else its flat range.
Tensor ZeroRedundancyOptimizer::data_of(const Piece& piece) const {
  const Tensor p = all_params_[static_cast<size_t>(piece.param)].detach();
  if (is_whole(piece)) return p;
  return p.view({-1}).slice(0, piece.begin, piece.end);
}

// Gives each cut piece its range of the parameter's gradient, as a view (an
// undefined gradient stays undefined: the inner optimizer skips the piece,
// as the plain one skips the parameter). Whole pieces are the parameters
// themselves and have their gradients already.
void ZeroRedundancyOptimizer::bind_grads() {
  NoGradGuard no_grad;
  for (size_t k = 0; k < local_pieces_.size(); ++k) {
    const Piece& piece = local_pieces_[k];
    if (is_whole(piece)) continue;
    Tensor& p = all_params_[static_cast<size_t>(piece.param)];
    Tensor g = p.grad();
    if (g.defined() && !g.is_contiguous()) {
      g = g.contiguous();
      p.set_grad(g);  // so that clipping the view scales the gradient itself
    }
    local_params_[k].set_grad(g.defined() ? g.view({-1}).slice(0, piece.begin, piece.end) : Tensor{});
  }
}

// Drops the views bound above, so that they keep no gradient alive after
// zero_grad() (which only sees the parameters).
void ZeroRedundancyOptimizer::release_grads() {
  for (size_t k = 0; k < local_pieces_.size(); ++k) {
    if (!is_whole(local_pieces_[k])) local_params_[k].set_grad(Tensor{});
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

// Every rank must hold the same parameters in the same order, or the
// partitions (and every collective after) would disagree: compare counts and
// a hash of the shapes and dtypes with one all-gather.
void ZeroRedundancyOptimizer::check_same_parameters_on_every_rank(
    const std::vector<ParamGroup>& groups) const {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](int64_t v) {
    hash ^= static_cast<uint64_t>(v);
    hash *= 1099511628211ull;
  };
  int64_t numel = 0;
  for (const auto& g : groups) mix(static_cast<int64_t>(g.params.size()));
  for (const auto& p : all_params_) {
    numel += p.numel();
    mix(static_cast<int64_t>(p.dtype()));
    for (int64_t d : p.shape()) mix(d);
    mix(-1);
  }
  const int n = group_->size();
  Tensor mine = Tensor::from_vector(
      std::vector<int64_t>{static_cast<int64_t>(all_params_.size()), numel, static_cast<int64_t>(hash)}, {3});
  Tensor all = Tensor::zeros({3 * static_cast<int64_t>(n)}, DType::i64);
  group_->allgather(all, mine)->wait();
  const auto v = all.to_vector<int64_t>();
  for (int r = 1; r < n; ++r) {
    const size_t o = 3 * static_cast<size_t>(r);
    LOCKSTEP_CHECK(v[o] == v[0] && v[o + 1] == v[1],
                   "{}: rank {} passed {} parameters ({} elements), rank 0 passed {} ({} "
                   "elements); every rank must pass the same parameters in the same order",
                   kName, r, v[o], v[o + 1], v[0], v[1]);
    LOCKSTEP_CHECK(v[o + 2] == v[2],
                   "{}: rank {}'s parameters differ from rank 0's in shape, dtype or grouping; "
                   "every rank must pass the same parameters in the same order",
                   kName, r);
  }
}

// Module::to rebinds a parameter to new storage of another dtype or device;
// the cut pieces' views would keep stepping the old storage and the sync
// buffers would round or move the values (ranks then differ). Every rank
// converts alike, so every rank refuses alike.
void ZeroRedundancyOptimizer::check_not_moved(const char* what) const {
  for (size_t i = 0; i < all_params_.size(); ++i) {
    const Tensor& p = all_params_[i];
    const auto& [dtype, device] = placed_[i];
    LOCKSTEP_CHECK(p.dtype() == dtype && p.device() == device,
                   "{}.{}: parameter {} is now {} on {}, but was {} on {} when the optimizer was "
                   "built (the model was moved or converted with .to() since); build the "
                   "{} after model.to(...)",
                   kName, what, i, runtime::dtype_name(p.dtype()), p.device().str(),
                   runtime::dtype_name(dtype), device.str(), kName);
  }
}

void ZeroRedundancyOptimizer::plan_sync() {
  buckets_.clear();
  const int n = group_->size();
  if (n == 1) return;
  std::set<DType> dtypes;
  for (const auto& p : all_params_) dtypes.insert(p.dtype());
  const Tensor& any = all_params_.front();
  // By owner, global order; the pieces of parameters step() cannot change
  // (sent_) are left out.
  std::vector<std::vector<size_t>> pieces_of(static_cast<size_t>(n));
  for (size_t k = 0; k < partition_.pieces.size(); ++k) {
    const Piece& piece = partition_.pieces[k];
    if (!sent_[static_cast<size_t>(piece.param)]) continue;
    pieces_of[static_cast<size_t>(piece.owner)].push_back(k);
  }
  auto dtype_of = [&](size_t k) { return all_params_[static_cast<size_t>(partition_.pieces[k].param)].dtype(); };

  if (options_.sync == ZeroOptions::Sync::Allgather) {
    for (DType dtype : dtypes) {
      // slot: the largest rank's elements of this dtype; offsets: rank base + running.
      std::vector<int64_t> used(static_cast<size_t>(n), 0);
      Bucket b;
      for (int r = 0; r < n; ++r) {
        for (size_t k : pieces_of[static_cast<size_t>(r)]) {
          if (dtype_of(k) != dtype) continue;
          b.pieces.push_back(k);
          b.offsets.push_back(used[static_cast<size_t>(r)]);  // rebased below
          used[static_cast<size_t>(r)] += partition_.pieces[k].numel();
        }
      }
      const int64_t slot = *std::max_element(used.begin(), used.end());
      if (slot == 0) continue;
      for (size_t j = 0; j < b.pieces.size(); ++j) b.offsets[j] += slot * partition_.pieces[b.pieces[j]].owner;
      b.buffer = Tensor::zeros({slot * n}, dtype, any.device());
      b.input = Tensor::zeros({slot}, dtype, any.device());
      buckets_.push_back(std::move(b));
    }
    return;
  }

  // Broadcast: per owner and dtype, pieces in global order; one at least the
  // cap goes alone and direct, smaller ones fill packed buckets.
  // Clamped: 1e13 MiB is past int64, and any cap past 2^62 bytes is "no cap".
  const auto cap = static_cast<int64_t>(std::min(options_.bucket_cap_mb * 1024 * 1024, 0x1p62));
  for (int r = 0; r < n; ++r) {
    for (DType dtype : dtypes) {
      const auto element = static_cast<int64_t>(runtime::dtype_size(dtype));
      Bucket open;
      int64_t used = 0;
      auto close = [&] {
        if (open.pieces.empty()) return;
        open.root = r;
        open.buffer = Tensor::empty({used}, dtype, any.device());
        buckets_.push_back(std::move(open));
        open = Bucket{};
        used = 0;
      };
      for (size_t k : pieces_of[static_cast<size_t>(r)]) {
        if (dtype_of(k) != dtype) continue;
        const int64_t count = partition_.pieces[k].numel();
        if (count * element >= cap) {
          buckets_.push_back(Bucket{.root = r, .direct = true, .pieces = {k}, .offsets = {0}});
          continue;
        }
        if ((used + count) * element > cap) close();
        open.pieces.push_back(k);
        open.offsets.push_back(used);
        used += count;
      }
      close();
    }
  }
}

// Sends every piece from its owner to all ranks: all collectives issued
// first, then waited for, so the backend may overlap them.
void ZeroRedundancyOptimizer::sync_parameters() {
  if (buckets_.empty()) return;
  NoGradGuard no_grad;
  const int rank = group_->rank();
  auto piece = [&](const Bucket& b, size_t j) -> const Piece& { return partition_.pieces[b.pieces[j]]; };
  // Piece j of bucket b's place in `buffer` (or, shifted by `base`, in `input`), in the piece's shape.
  auto flat = [&](const Bucket& b, size_t j, const Tensor& buffer, int64_t base, const Tensor& data) {
    const int64_t at = b.offsets[j] - base;
    return buffer.slice(0, at, at + data.numel()).view(data.shape());
  };
  std::vector<std::shared_ptr<Work>> works;
  std::vector<Tensor> direct(buckets_.size());  // the tensor a direct bucket sends
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.root < 0) {
      const int64_t base = b.input.numel() * rank;
      for (size_t j = 0; j < b.pieces.size(); ++j) {
        if (piece(b, j).owner != rank) continue;
        const Tensor data = data_of(piece(b, j));
        flat(b, j, b.input, base, data).copy_(data);
      }
      works.push_back(group_->allgather(b.buffer, b.input));
    } else if (b.direct) {
      direct[i] = data_of(piece(b, 0)).contiguous();
      works.push_back(group_->broadcast(direct[i], {.root = b.root}));
    } else {
      if (b.root == rank) {
        for (size_t j = 0; j < b.pieces.size(); ++j) {
          const Tensor data = data_of(piece(b, j));
          flat(b, j, b.buffer, 0, data).copy_(data);
        }
      }
      works.push_back(group_->broadcast(b.buffer, {.root = b.root}));
    }
  }
  for (auto& w : works) w->wait();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    if (b.root == rank) continue;
    if (b.direct) {
      Tensor data = data_of(piece(b, 0));
      // The broadcast counted its write; a parameter that was not
      // contiguous was broadcast from a copy.
      if (direct[i].storage() != data.storage()) data.copy_(direct[i]);
      continue;
    }
    for (size_t j = 0; j < b.pieces.size(); ++j) {
      if (piece(b, j).owner == rank) continue;
      Tensor data = data_of(piece(b, j));
      data.copy_(flat(b, j, b.buffer, 0, data));
    }
  }
}

// A state with no entries for the probe: group g's options, and its scalar
// (if it has one) numbered as the probe's state_dict() numbers it.
OptimizerState ZeroRedundancyOptimizer::probe_state(
    const std::function<const GroupOptions&(size_t)>& options_of) const {
  OptimizerState check;
  int64_t number = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    OptimizerState::Group group{options_of(g), {}};
    if (!probe_->param_groups()[g].params.empty()) group.params.push_back(number++);
    check.param_groups.push_back(std::move(group));
  }
  return check;
}

void ZeroRedundancyOptimizer::validate(const GroupOptions& options) const {
  probe_->load_state_dict(probe_state([&](size_t) -> const GroupOptions& { return options; }));
}

// The options as edited in param_groups(), checked the same way on every rank
// (the probe), then copied to the inner optimizer's groups.
void ZeroRedundancyOptimizer::sync_options() {
  probe_->load_state_dict(
      probe_state([&](size_t g) -> const GroupOptions& { return groups_[g].options; }));
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = probe_->param_groups()[g].options;
  if (!inner_) return;
  auto& inner_groups = inner_->param_groups();
  for (size_t i = 0; i < inner_groups.size(); ++i) inner_groups[i].options = groups_[outer_of_inner_[i]].options;
}

void ZeroRedundancyOptimizer::step() {
  check_not_moved("step");
  sync_options();
  if (inner_) {
    bind_grads();
    inner_->step();
    release_grads();
  }
  // A parameter frozen or unfrozen since the last step changes what is sent.
  if (std::vector<bool> now = changeable(); now != sent_) {
    sent_ = std::move(now);
    plan_sync();
  }
  sync_parameters();
}

double ZeroRedundancyOptimizer::clip_grad_norm(double max_norm, double norm_type,
                                               bool error_if_nonfinite) {
  LOCKSTEP_CHECK(max_norm >= 0.0,
                 "{}.clip_grad_norm: max_norm must be a number >= 0 (the largest total norm to "
                 "allow), got {}",
                 kName, max_norm);
  check_not_moved("clip_grad_norm");
  // The partial and a NaN flag: a NaN must survive a max reduction too.
  bind_grads();
  const double partial = grad_norm_partial(local_params_, norm_type);
  const bool nan = std::isnan(partial);
  Tensor t = Tensor::from_vector(std::vector<double>{nan ? 0.0 : partial, nan ? 1.0 : 0.0}, {2});
  const bool inf_norm = std::isinf(norm_type);
  group_->allreduce(t, {.op = inf_norm ? ReduceOp::Max : ReduceOp::Sum})->wait();
  const auto v = t.to_vector<double>();
  const double total = v[1] > 0 ? std::nan("") : norm_from_partial(v[0], norm_type);
  LOCKSTEP_CHECK(!error_if_nonfinite || std::isfinite(total),
                 "{}.clip_grad_norm: the total norm of order {} of the gradients is {}; some "
                 "gradient holds NaN or infinity (check the loss and the learning rate), or pass "
                 "error_if_nonfinite = false to clip anyway",
                 kName, norm_type, total);
  clip_grads_with_norm(local_params_, max_norm, total);  // in place: the views scale the gradients
  release_grads();
  return total;
}

// Gathering the state. Each rank describes its state tensors in a line of
// text each (global index, key, dtype, shape); one all-gather of those texts
// (as i64 words, padded to the longest) tells every rank what follows. Then
// each rank in turn broadcasts its tensors packed per dtype; rank `to` keeps
// copies, the others drop them.
void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int n = group_->size(), rank = group_->rank();
  LOCKSTEP_CHECK(to >= 0 && to < n, "{}.consolidate_state_dict: rank {} is not in the group of {}",
                 kName, to, n);
  std::vector<EntryInfo> mine;
  std::vector<Tensor> mine_tensors;
  if (inner_) {
    const OptimizerState local = inner_->state_dict();
    for (const auto& [index, entries] : local.state) {
      const Piece& piece = local_pieces_[static_cast<size_t>(index)];
      for (const auto& [key, value] : entries) {
        mine.push_back({piece.param, piece.begin, piece.end, key, value.dtype(), value.shape()});
        mine_tensors.push_back(value);
      }
    }
  }
  const std::vector<std::string> texts = collectives::allgather_text(describe_entries(mine), *group_);

  NoGradGuard no_grad;
  auto full = std::make_unique<OptimizerState>();
  Stitcher stitch(all_params_, *full);
  for (int r = 0; r < n; ++r) {
    const auto entries = parse_entries(texts[static_cast<size_t>(r)]);
    std::set<DType> dtypes;
    for (const auto& e : entries) dtypes.insert(e.dtype);
    for (DType dtype : dtypes) {
      int64_t total = 0;
      for (const auto& e : entries) total += e.dtype == dtype ? runtime::shape_numel(e.shape) : 0;
      Tensor buffer = Tensor::empty({total}, dtype);
      int64_t offset = 0;
      if (r == rank) {
        for (size_t k = 0; k < entries.size(); ++k) {
          if (entries[k].dtype != dtype) continue;
          const int64_t count = runtime::shape_numel(entries[k].shape);
          buffer.slice(0, offset, offset + count).copy_(mine_tensors[k].detach().to(runtime::Device::cpu()).reshape({count}));
          offset += count;
        }
      }
      group_->broadcast(buffer, {.root = r})->wait();
      if (rank != to) continue;
      offset = 0;
      for (const auto& e : entries) {
        if (e.dtype != dtype) continue;
        const int64_t count = runtime::shape_numel(e.shape);
        stitch.add(e, buffer.slice(0, offset, offset + count).view(e.shape));
        offset += count;
      }
    }
  }
  consolidated_on_ = to;
  consolidated_.reset();
  if (rank != to) return;
  stitch.check_complete();
  int64_t index = 0;
  for (const auto& g : groups_) {
    OptimizerState::Group saved{g.options, {}};
    for (size_t i = 0; i < g.params.size(); ++i) saved.params.push_back(index++);
    full->param_groups.push_back(std::move(saved));
  }
  consolidated_ = std::move(full);
}

OptimizerState ZeroRedundancyOptimizer::state_dict() const {
  LOCKSTEP_CHECK(consolidated_on_ >= 0,
                 "{}.state_dict: the optimizer state has not been consolidated; call "
                 "consolidate_state_dict(to) on every rank first, then state_dict() on rank `to`",
                 kName);
  LOCKSTEP_CHECK(consolidated_ != nullptr,
                 "{}.state_dict: the state was consolidated on rank {}, not on this rank ({}); "
                 "call state_dict() there, or consolidate_state_dict({}) on every rank",
                 kName, consolidated_on_, group_->rank(), group_->rank());
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const OptimizerState& full) {
  const std::string what = fmt::format("{}.load_state_dict", kName);
  LOCKSTEP_CHECK(full.param_groups.size() == groups_.size(),
                 "{}: the saved state has {} parameter group(s), this optimizer has {}", what,
                 full.param_groups.size(), groups_.size());
  // Saved parameter number -> global index, by position; every check runs on
  // every rank, so all ranks fail alike or none does.
  std::map<int64_t, int64_t> global_of;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& sg = full.param_groups[g];
    LOCKSTEP_CHECK(sg.params.size() == groups_[g].params.size(),
                   "{}: saved parameter group {} has {} parameter(s), this optimizer's has {}", what,
                   g, sg.params.size(), groups_[g].params.size());
    for (int64_t number : sg.params) global_of[number] = index++;
  }
  const OptimizerState check =
      probe_state([&](size_t g) -> const GroupOptions& { return full.param_groups[g].options; });
  for (const auto& [number, entries] : full.state) {
    auto it = global_of.find(number);
    LOCKSTEP_CHECK(it != global_of.end(),
                   "{}: the saved state is for parameter {}, which no saved parameter group lists",
                   what, number);
    const Tensor& p = all_params_[static_cast<size_t>(it->second)];
    // The inner optimizer's rule, against the whole parameter (a cut
    // piece's share of an entry passes it too): only its owner loads it.
    for (const auto& [key, value] : entries) check_state_entry(what, number, key, value, p);
    probe_->check_state_keys(what, number, entries);
  }
  const std::vector<ParamGroup> before = groups_;
  probe_->load_state_dict(check);  // validates the options (keys missing keep their value)
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = probe_->param_groups()[g].options;
  if (!inner_) return;

  std::map<int64_t, int64_t> local_of;  // global index -> inner number (one piece per parameter here)
  for (size_t i = 0; i < local_pieces_.size(); ++i) local_of[local_pieces_[i].param] = static_cast<int64_t>(i);
  OptimizerState local;
  int64_t number = 0;
  for (size_t i = 0; i < outer_of_inner_.size(); ++i) {
    OptimizerState::Group lg{groups_[outer_of_inner_[i]].options, {}};
    for (size_t k = 0; k < inner_->param_groups()[i].params.size(); ++k) lg.params.push_back(number++);
    local.param_groups.push_back(std::move(lg));
  }
  for (const auto& [saved_number, entries] : full.state) {
    auto it = local_of.find(global_of.at(saved_number));
    if (it == local_of.end()) continue;
    const Piece& piece = local_pieces_[static_cast<size_t>(it->second)];
    auto& mine = local.state[it->second];
    for (const auto& [key, value] : entries) {
      // The inner optimizer clones what it loads: a view of the range will do.
      const bool cut = !is_whole(piece) && value.dim() > 0;
      mine[key] = cut ? value.detach().contiguous().view({-1}).slice(0, piece.begin, piece.end) : value;
    }
  }
  try {
    inner_->load_state_dict(local);
  } catch (...) {
    groups_ = before;
    throw;
  }
}

void ZeroRedundancyOptimizer::check_state_keys(std::string_view what, int64_t index,
                                               const std::map<std::string, Tensor>& entries) const {
  probe_->check_state_keys(what, index, entries);
}

void ZeroRedundancyOptimizer::add_param_group(ParamGroup) {
  throw Error(fmt::format("{}: add_param_group after construction is not supported; pass every "
                          "group to the constructor. To unfreeze parameters later (a backbone "
                          "after its head), give them a group of their own from the start: "
                          "while frozen, without gradients, they are skipped and not sent",
                          kName));
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  if (!inner_) return 0;
  int64_t total = 0;
  for (const auto& [index, entries] : inner_->state_dict().state) {
    for (const auto& [key, value] : entries) total += bytes_of(value);
  }
  return total;
}

std::vector<int64_t> ZeroRedundancyOptimizer::all_state_bytes() const {
  Tensor mine = Tensor::from_vector(std::vector<int64_t>{local_state_bytes()}, {1});
  Tensor all = Tensor::zeros({group_->size()}, DType::i64);
  group_->allgather(all, mine)->wait();
  return all.to_vector<int64_t>();
}

}  // namespace lockstep::optim
