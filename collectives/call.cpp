#include "lockstep/collectives/call.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace lockstep::collectives {
namespace {

bool has_root(CollectiveKind kind) {
  return kind == CollectiveKind::broadcast || kind == CollectiveKind::reduce;
}

bool has_op(CollectiveKind kind) {
  return kind == CollectiveKind::allreduce || kind == CollectiveKind::reduce ||
         kind == CollectiveKind::reduce_scatter;
}

}  // namespace

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  const std::vector<int> head(ranks.begin(), ranks.end() - 1);
  return fmt::format("ranks {} and {}", fmt::join(head, ", "), ranks.back());
}

std::string_view to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce:
      return "allreduce";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::reduce:
      return "reduce";
    case CollectiveKind::allgather:
      return "allgather";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::barrier:
      return "barrier";
  }
  return "unknown";
}

bool CallSignature::same_call(const CallSignature& o) const {
  return seq == o.seq && kind == o.kind && dtype == o.dtype && count == o.count && root == o.root &&
         op == o.op && step == o.step;
}

std::string CallSignature::text() const {
  if (kind == CollectiveKind::barrier) return "barrier()";
  std::string extra;
  if (has_op(kind)) extra += fmt::format(", {}", collectives::to_string(op));
  if (has_root(kind)) extra += fmt::format(", root {}", root);
  return fmt::format("{}({}, {} elements{})", to_string(kind), runtime::dtype_name(dtype), count,
                     extra);
}

std::string Call::rank_name(int rank) const {
  if (ranks == nullptr || rank < 0 || static_cast<size_t>(rank) >= ranks->size())
    return fmt::format("rank {}", rank);
  return fmt::format("rank {} of {}", (*ranks)[static_cast<size_t>(rank)], *group);
}

std::string Call::description() const {
  const std::string head = own.seq > 0 ? fmt::format("{} #{}", op, own.seq) : std::string(op);
  std::string detail = extra;
  if (detail.empty() && own.seq > 0) {
    if (has_op(own.kind)) detail = collectives::to_string(own.op);
    if (has_root(own.kind))
      detail += fmt::format("{}root {}", detail.empty() ? "" : ", ", own.root);
  }
  if (has_tensor) {
    return fmt::format("{} ({}, {} elements{}{})", head, runtime::dtype_name(own.dtype), own.count,
                       detail.empty() ? "" : ", ", detail);
  }
  return detail.empty() ? head : fmt::format("{} ({})", head, detail);
}

// Layout: seq | count | root, rank | kind, dtype, op, step, 4 zero bytes.
PackedSignature pack(const CallSignature& s) {
  PackedSignature w{};
  w[0] = s.seq;
  w[1] = static_cast<uint64_t>(s.count);
  w[2] =
      (static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 32) | static_cast<uint32_t>(s.rank);
  w[3] = static_cast<uint64_t>(s.kind) | (static_cast<uint64_t>(s.dtype) << 8) |
         (static_cast<uint64_t>(s.op) << 16) | (static_cast<uint64_t>(s.step) << 24);
  return w;
}

CallSignature unpack(const PackedSignature& w) {
  CallSignature s;
  s.seq = w[0];
  s.count = static_cast<int64_t>(w[1]);
  s.root = static_cast<int32_t>(static_cast<uint32_t>(w[2] >> 32));
  s.rank = static_cast<int32_t>(static_cast<uint32_t>(w[2]));
  s.kind = static_cast<CollectiveKind>(w[3] & 0xff);
  s.dtype = static_cast<runtime::DType>((w[3] >> 8) & 0xff);
  s.op = static_cast<ReduceOp>((w[3] >> 16) & 0xff);
  s.step = static_cast<uint8_t>((w[3] >> 24) & 0xff);
  return s;
}

namespace {

// splitmix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t call_hash(const CallSignature& s) {
  CallSignature compared = s;
  compared.rank = 0;
  uint64_t h = 0x6c6f636b73746570ull;
  for (uint64_t word : pack(compared)) h = mix(h ^ word);
  return h;
}

std::string mismatch_message(const Call& call, const std::vector<CallSignature>& every_rank) {
  // Ranks grouped by call, in order of each call's first rank.
  std::vector<std::pair<CallSignature, std::vector<int>>> calls;
  for (size_t i = 0; i < every_rank.size(); ++i) {
    const CallSignature& s = every_rank[i];
    const int rank = s.rank >= 0 ? s.rank : static_cast<int>(i);
    auto it = std::find_if(calls.begin(), calls.end(),
                           [&](const auto& c) { return c.first.same_call(s); });
    if (it == calls.end()) {
      calls.push_back({s, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [s, ranks] : calls) {
    std::string what = s.text();
    if (s.seq != call.signature.seq) what += fmt::format(" as its collective #{}", s.seq);
    const bool ambiguous = std::count_if(calls.begin(), calls.end(), [&](const auto& c) {
                             return c.first.text() == s.text() && c.first.seq == s.seq;
                           }) > 1;
    if (ambiguous) what += fmt::format(" (step {} of it)", s.step);
    parts.push_back(fmt::format("{} called {}", ranks_text(ranks), what));
  }
  return fmt::format(
      "collective #{} differs across the ranks of {}: {}. Every rank must issue the same "
      "collectives, with the same dtype, element count and root, in the same order (a "
      "different number of steps per rank, from a different batch size, sample count or epoch "
      "count, is the usual cause); the group is unusable now",
      call.signature.seq, *call.group, fmt::join(parts, "; "));
}

std::string timeout_message(const Call& call, std::string_view where, std::string_view detail) {
  return fmt::format(
      "{} timed out after {:.3g} s on {}: {}; raise the timeout with LOCKSTEP_TIMEOUT_S or the "
      "call's .timeout if the wait was legitimate",
      call.description(), static_cast<double>(call.timeout.count()) / 1000.0, where,
      detail.empty() ? std::string_view("some rank did not join this collective in time (it may "
                                        "have died or be stuck)")
                     : detail);
}

std::string stall_message(const Call& call, std::string_view where,
                          std::chrono::steady_clock::duration waited, std::string_view detail) {
  const auto seconds = [](std::chrono::steady_clock::duration d) {
    return std::chrono::duration_cast<std::chrono::duration<double>>(d).count();
  };
  const auto left = call.deadline - std::chrono::steady_clock::now();
  return fmt::format(
      "lockstep: {}: {} has waited {:.0f} s for other ranks: {}; it waits {:.0f} s "
      "more before it gives up",
      where, call.description(), seconds(waited),
      detail.empty() ? std::string_view("some rank has not joined it") : detail,
      std::max(0.0, seconds(left)));
}

}  // namespace lockstep::collectives
