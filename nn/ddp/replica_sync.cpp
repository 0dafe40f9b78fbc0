#include "lockstep/nn/ddp/replica_sync.h"

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "lockstep/collectives/rank_text.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/stable_hash.h"

namespace lockstep::nn {
namespace {

using runtime::DType;
using runtime::Tensor;

// "'name' [shape] dtype", a tab, and whether it trains: the reducer buckets
// the parameters that require grad, so ranks that freeze different ones
// would average unrelated gradients together.
constexpr char kTrained[] = "requires_grad";
constexpr char kFrozen[] = "frozen";

std::string describe(const std::string& name, const Tensor& t) {
  return fmt::format("'{}' {} {}\t{}", name, runtime::shape_str(t.shape()),
                     runtime::dtype_name(t.dtype()), t.requires_grad() ? kTrained : kFrozen);
}

// The description without the requires_grad part.
std::string what_of(const std::string& line) { return line.substr(0, line.find('\t')); }
std::string flag_of(const std::string& line) {
  const auto tab = line.find('\t');
  return tab == std::string::npos ? std::string() : line.substr(tab + 1);
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Every rank's `mine`, one line per entry; nothing where all ranks agree.
std::optional<std::vector<std::vector<std::string>>> gathered_lines(
    const std::string& mine, collectives::ProcessGroup& group) {
  const auto all = collectives::allgather_text(mine, group);
  if (std::all_of(all.begin(), all.end(), [&](const auto& s) { return s == all[0]; }))
    return std::nullopt;
  std::vector<std::vector<std::string>> lists;
  for (const auto& s : all) lists.push_back(split_lines(s));
  return lists;
}

// The first entry whose description (what_of) differs between rank 0 and
// some other rank: its index, rank 0's description, and "; rank(s) R hold(s)
// X" for each other description. `absent` stands for a list that ends early.
struct Difference {
  size_t index;
  std::string rank0, others;
};
std::optional<Difference> first_difference(const std::vector<std::vector<std::string>>& lists,
                                           const std::string& absent) {
  size_t longest = 0;
  for (const auto& l : lists) longest = std::max(longest, l.size());
  auto at = [&](const std::vector<std::string>& l, size_t i) {
    return i < l.size() ? what_of(l[i]) : absent;
  };
  for (size_t i = 0; i < longest; ++i) {
    std::map<std::string, std::vector<int>> holders;  // what differs from rank 0, and who
    for (size_t r = 1; r < lists.size(); ++r) {
      const std::string what = at(lists[r], i);
      if (what != at(lists[0], i)) holders[what].push_back(static_cast<int>(r));
    }
    if (holders.empty()) continue;
    std::string others;
    for (const auto& [what, ranks] : holders) {
      others += fmt::format("; rank{} {} {} {}", ranks.size() > 1 ? "s" : "",
                            fmt::join(ranks, ", "), ranks.size() > 1 ? "hold" : "holds", what);
    }
    return Difference{i, at(lists[0], i), others};
  }
  return std::nullopt;
}

}  // namespace

void verify_same_parameters(const std::vector<std::pair<std::string, Tensor>>& params,
                            collectives::ProcessGroup& group) {
  if (group.size() == 1) return;
  std::string mine;
  for (const auto& [name, t] : params) mine += describe(name, t) + "\n";
  const auto lists = gathered_lines(mine, group);
  if (!lists) return;
  const auto diff = first_difference(*lists, "no parameter (the model has fewer)");
  // Before it, the same parameters everywhere: does every rank train each, or none?
  const size_t same = diff ? diff->index : (*lists)[0].size();
  for (size_t i = 0; i < same; ++i) {
    std::vector<int> trains, freezes;
    for (size_t r = 0; r < lists->size(); ++r) {
      (flag_of((*lists)[r][i]) == kTrained ? trains : freezes).push_back(static_cast<int>(r));
    }
    if (trains.empty() || freezes.empty()) continue;
    auto ranks = [](const std::vector<int>& rs) {
      return fmt::format("rank{} {}", rs.size() > 1 ? "s" : "", fmt::join(rs, ", "));
    };
    throw Error(fmt::format(
        "DistributedDataParallel: the ranks freeze different parameters. Parameter #{} {} "
        "requires grad on {} and is frozen (requires_grad false) on {}. DDP averages the "
        "gradients of the parameters that require grad, bucket by bucket, so ranks training "
        "different ones would average unrelated gradients together; set requires_grad the "
        "same way on every rank before wrapping the model",
        i, what_of((*lists)[0][i]), ranks(trains), ranks(freezes)));
  }
  if (!diff) return;
  throw Error(fmt::format(
      "DistributedDataParallel: the ranks hold different models. Parameter #{}: rank 0 holds "
      "{}{} ({} parameters on rank 0). Build the same model on every rank (same layers, "
      "sizes and dtypes, registered in the same order)",
      diff->index, diff->rank0, diff->others, (*lists)[0].size()));
}

void verify_same_buffers(const std::vector<std::pair<std::string, Tensor>>& buffers,
                         collectives::ProcessGroup& group) {
  if (group.size() == 1) return;
  std::string mine;
  for (const auto& [name, t] : buffers) mine += describe(name, t) + "\n";
  const auto lists = gathered_lines(mine, group);
  if (!lists) return;
  const auto diff = first_difference(*lists, "no buffer (the model has fewer)");
  if (!diff) return;
  throw Error(fmt::format(
      "DistributedDataParallel: the ranks hold different buffers. Buffer #{}: rank 0 holds "
      "{}{} ({} buffers on rank 0). DDP copies rank 0's buffers into every rank's, packed "
      "together (at construction, and before each training forward with broadcast_buffers), "
      "so every rank must hold the same buffers (names, shapes and dtypes, registered in the "
      "same order); give each buffer a size that depends on neither the rank nor its data",
      diff->index, diff->rank0, diff->others, (*lists)[0].size()));
}

void verify_replicas_identical(const std::vector<std::pair<std::string, Tensor>>& params,
                               collectives::ProcessGroup& group, const std::string& when) {
  if (group.size() == 1 || params.empty()) return;
  const auto count = static_cast<int64_t>(params.size());
  std::vector<int64_t> mine;
  mine.reserve(params.size());
  for (const auto& [name, p] : params) {
    const Tensor host = p.detach().to(runtime::Device::cpu()).contiguous();
    const size_t esize = runtime::dtype_size(host.dtype());
    const auto* data = static_cast<const char*>(host.storage()->data()) +
                       static_cast<size_t>(host.storage_offset()) * esize;
    mine.push_back(static_cast<int64_t>(
        runtime::hash_bytes(data, static_cast<size_t>(host.numel()) * esize)));
  }
  // On the parameters' device: NCCL takes device tensors only.
  const runtime::Device device = params.front().second.device();
  Tensor hashes = Tensor::from_vector(mine, {count}).to(device);
  Tensor all = Tensor::empty({count * group.size()}, DType::i64, device);
  group.allgather(all, hashes, {})->wait();
  const auto every = all.to(runtime::Device::cpu()).to_vector<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int> differ;
    for (int r = 1; r < group.size(); ++r)
      if (every[static_cast<size_t>(r * count + i)] != every[static_cast<size_t>(i)]) differ.push_back(r);
    if (differ.empty()) continue;
    throw Error(fmt::format(
        "DistributedDataParallel: the replicas diverged {}: parameter '{}' (#{} of {}) on rank{} "
        "{} holds other bits than rank 0's. Every rank must change its parameters the same way: "
        "a change made by hand on one rank must be made on all, or undone with "
        "broadcast_parameters(); otherwise suspect a nondeterministic kernel or corrupted memory "
        "on {}",
        when, params[static_cast<size_t>(i)].first, i, count, differ.size() > 1 ? "s" : "",
        fmt::join(differ, ", "), differ.size() > 1 ? "those ranks" : "that rank"));
  }
}

namespace {

// What every backend's collectives move: CUDA tensors of u8 and bool are
// refused (ProcessGroup::check_tensor), so those travel as words everywhere.
bool collectives_take(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16 ||
         d == DType::i32 || d == DType::i64;
}

}  // namespace

void broadcast_coalesced(const std::vector<Tensor>& tensors, collectives::ProcessGroup& group,
                         int root) {
  if (group.size() == 1 || tensors.empty()) return;
  // Packed on the tensors' own device: a CUDA model's buffers, broadcast
  // before each forward, do not go through the host.
  std::map<std::tuple<runtime::DeviceType, int, DType>, std::vector<Tensor>> groups;
  for (const Tensor& t : tensors)
    groups[{t.device().type, t.device().index, t.dtype()}].push_back(t);
  runtime::NoGradGuard no_grad;  // parameters are leaves that require grad
  for (auto& [key, list] : groups) {
    const DType dtype = std::get<2>(key);
    int64_t total = 0;
    for (const Tensor& t : list) total += t.numel();
    // A broadcast copies bytes, whatever they mean: the one-byte dtypes the
    // CUDA collectives do not take (u8, bool: a mask, a flag) travel as i32 words,
    // four to a word, in a buffer padded to whole words.
    const bool as_words = !collectives_take(dtype);
    LOCKSTEP_ASSERT(!as_words || runtime::dtype_size(dtype) == 1);
    Tensor flat =
        Tensor::empty({as_words ? (total + 3) / 4 * 4 : total}, dtype, list[0].device());
    Tensor sent = flat;
    if (as_words) {
      sent = Tensor(std::make_shared<runtime::TensorImpl>(
          flat.storage(), runtime::Shape{flat.numel() / 4}, runtime::Shape{1}, 0, DType::i32));
    }
    int64_t offset = 0;
    if (group.rank() == root) {
      if (as_words) sent.fill_(0);  // the padding: defined bytes on the wire
      for (const Tensor& t : list) {
        flat.slice(0, offset, offset + t.numel()).view(t.shape()).copy_(t);
        offset += t.numel();
      }
    }
    group.broadcast(sent, {.root = root})->wait();
    if (group.rank() == root) continue;
    offset = 0;
    for (const Tensor& t : list) {
      Tensor(t).copy_(flat.slice(0, offset, offset + t.numel()).view(t.shape()));
      offset += t.numel();
    }
  }
}

}  // namespace lockstep::nn
