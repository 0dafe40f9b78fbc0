#include "lockstep/collectives/gloo/gloo_call_check.h"

#include <fmt/format.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <chrono>

#include "lockstep/collectives/work.h"

namespace lockstep::collectives::gloo_backend {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Slots of the check: gloo's collectives use prefixes 0x01..0x08 in the top
// byte (gloo/types.h) and send/recv 0x40 and 0x42 (gloo_group.cpp).
constexpr uint64_t kCheckSlotPrefix = uint64_t{0x41} << 56;
constexpr size_t kBytes = sizeof(PackedSignature);

// Rounded up: a wait cut short of the deadline by the rounding would end
// before it, and the caller would not know the timeout had come.
milliseconds left_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
  return std::max(left, milliseconds(1));
}

// A wait that abort() ended (gloo's waits return false then).
void throw_if_aborted(bool completed) {
  if (!completed) throw Error("this rank aborted the group while the call was being checked");
}

}  // namespace

GlooCallCheck::GlooCallCheck(std::shared_ptr<::gloo::Context> context, int rank, int size)
    : context_(std::move(context)),
      rank_(rank),
      size_(size),
      arrived_(static_cast<size_t>(size)),
      last_seen_(static_cast<size_t>(size)) {}

// One check's buffers: gloo may still hold pointers into them after a
// failure, until the context is gone, so a failed one is kept (graveyard_).
// One receive buffer per peer: a buffer with several receives reports only
// the last sender, and this check must know who has not sent.
struct GlooCallCheck::Exchange {
  PackedSignature mine{};
  std::vector<PackedSignature> theirs;
  std::unique_ptr<::gloo::transport::UnboundBuffer> out;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> in;  // by rank; null for this one
};

GlooCallCheck::~GlooCallCheck() = default;

void GlooCallCheck::check(const Call& call) {
  if (size_ == 1) return;
  auto x = std::make_unique<Exchange>();
  x->mine = pack(call.signature);
  x->theirs.assign(static_cast<size_t>(size_), PackedSignature{});
  x->theirs[static_cast<size_t>(rank_)] = x->mine;
  x->out = context_->createUnboundBuffer(x->mine.data(), kBytes);
  x->in.resize(static_cast<size_t>(size_));
  const uint64_t slot = kCheckSlotPrefix | (call.signature.seq & 0xffffffffffffull);
  {
    std::lock_guard lock(mutex_);
    std::fill(arrived_.begin(), arrived_.end(), false);
    arrived_[static_cast<size_t>(rank_)] = true;
    checking_ = true;
    call_ = &call;
  }
  int peer = -1;
  try {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      auto& in = x->in[static_cast<size_t>(q)];
      in = context_->createUnboundBuffer(&x->theirs[static_cast<size_t>(q)], kBytes);
      in->recv(q, slot);
      x->out->send(q, slot);
    }
    {
      // From here abort() ends the waits below: gloo keeps an ended wait's
      // abort for the buffer's next one, so none is missed.
      std::lock_guard lock(mutex_);
      throw_if_aborted(!aborted_);
      waiting_ = x.get();
    }
    for (peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      {
        std::lock_guard lock(mutex_);
        waiting_for_ = peer;
      }
      throw_if_aborted(
          x->in[static_cast<size_t>(peer)]->waitRecv(nullptr, left_until(call.deadline)));
      std::lock_guard lock(mutex_);
      arrived_[static_cast<size_t>(peer)] = true;
      last_seen_[static_cast<size_t>(peer)] = unpack(x->theirs[static_cast<size_t>(peer)]);
    }
    for (int i = 1; i < size_; ++i) {
      throw_if_aborted(x->out->waitSend(nullptr, left_until(call.deadline)));
    }
  } catch (const std::exception& e) {
    // Who else has sent: a receive that completed answers at once; one that
    // did not throws (the failure has closed the connections) or, on a
    // connection still open, gives up after a moment.
    for (int q = peer + 1; q < size_; ++q) {
      if (q == rank_ || peer < 0) continue;
      try {
        if (!x->in[static_cast<size_t>(q)]->waitRecv(nullptr, milliseconds(1))) continue;
        std::lock_guard lock(mutex_);
        arrived_[static_cast<size_t>(q)] = true;
        last_seen_[static_cast<size_t>(q)] = unpack(x->theirs[static_cast<size_t>(q)]);
      } catch (const std::exception&) {
      }
    }
    std::lock_guard lock(mutex_);
    checking_ = false;
    call_ = nullptr;
    waiting_ = nullptr;
    graveyard_.push_back(std::move(x));
    const std::string missing = missing_text(call, -1);
    if (Clock::now() >= call.deadline && !missing.empty()) throw DeadlineExceeded(missing);
    throw;
  }
  {
    std::lock_guard lock(mutex_);
    checking_ = false;
    call_ = nullptr;
    waiting_ = nullptr;
  }
  std::vector<CallSignature> every_rank;
  bool same = true;
  for (const PackedSignature& words : x->theirs) {
    every_rank.push_back(unpack(words));
    same = same && every_rank.back().same_call(call.signature);
  }
  if (!same) throw CollectiveMismatch(mismatch_message(call, every_rank));
}

void GlooCallCheck::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  if (waiting_ == nullptr) return;
  for (auto& in : waiting_->in) {
    if (in != nullptr) in->abortWaitRecv();
  }
  waiting_->out->abortWaitSend();
}

std::string GlooCallCheck::waiting_on() const {
  std::lock_guard lock(mutex_);
  return checking_ ? missing_text(*call_, waiting_for_) : std::string();
}

std::string GlooCallCheck::missing_text(const Call& call, int only) const {
  std::string text;
  for (int q = 0; q < size_; ++q) {
    if (arrived_[static_cast<size_t>(q)] || (only >= 0 && q != only)) continue;
    const CallSignature& seen = last_seen_[static_cast<size_t>(q)];
    if (!text.empty()) text += "; ";
    text +=
        seen.seq == 0
            ? fmt::format("{} did not join it and has joined no collective on this group",
                          call.rank_name(q))
            : fmt::format("{} did not join it; the last collective it joined was #{} {}",
                          call.rank_name(q), seen.seq, seen.text());
  }
  return text.empty() ? text : text + " (a rank stopped, deadlocked, or still computing)";
}

}  // namespace lockstep::collectives::gloo_backend
