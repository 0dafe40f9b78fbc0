#include "lockstep/distributed/exited_ranks.h"

#include <algorithm>
#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "lockstep/distributed/store/prefix_store.h"

namespace lockstep::distributed {
namespace {

// One key, a line "<rank> <how>" per rank, so that reading them all is one
// round trip however many ranks the job has.
constexpr const char* kKey = "lockstep/exited";

// The key's value without waiting: compare_set swaps only a value equal to
// the expected one, which no record is; a missing key reads as empty.
Bytes peek(Store& store) {
  const Bytes never{0x01};
  return store.compare_set(kKey, never, never);
}

}  // namespace

std::string attempt_prefix(int restart_count) {
  return restart_count > 0 ? fmt::format("restart-{}", restart_count) : std::string();
}

bool is_attempt_key(const std::string& key, int restart_count) {
  if (restart_count > 0) return key.starts_with(attempt_prefix(restart_count) + "/");
  if (key.starts_with("lockstep-run/")) return false;
  // "restart-<N>/...": a later attempt's.
  const std::string_view later = "restart-";
  if (!key.starts_with(later)) return true;
  const size_t slash = key.find('/');
  if (slash == std::string::npos || slash == later.size()) return true;
  return !std::all_of(key.begin() + static_cast<std::ptrdiff_t>(later.size()),
                      key.begin() + static_cast<std::ptrdiff_t>(slash),
                      [](char c) { return c >= '0' && c <= '9'; });
}

void record_exited_rank(Store& store, const ExitedRank& exited) {
  std::string how = exited.how.empty() ? std::string("ended") : exited.how;
  for (char& c : how) {
    if (c == '\n') c = ' ';
  }
  const std::string line = fmt::format("{} {}\n", exited.rank, how);
  Bytes current = peek(store);
  for (;;) {
    Bytes next = current;
    next.insert(next.end(), line.begin(), line.end());
    const Bytes now = store.compare_set(kKey, current, next);
    if (now == next) return;
    current = now;  // another rank's record came first
  }
}

ExitRecorder::ExitRecorder(TcpStoreOptions client) : client_(std::move(client)) {
  client_.connect_timeout = client_.timeout = std::chrono::seconds(2);
}

void ExitRecorder::record(int restart_count, const ExitedRank& exited) noexcept {
  try {
    if (!store_) store_ = std::make_shared<TcpStore>(client_);
    if (restart_count == 0) return record_exited_rank(*store_, exited);
    PrefixStore attempt(attempt_prefix(restart_count), store_);
    record_exited_rank(attempt, exited);
  } catch (const std::exception&) {
  }
}

std::vector<ExitedRank> exited_ranks(Store& store) {
  const std::string text = to_string(peek(store));
  std::vector<ExitedRank> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    const size_t space = line.find(' ');
    ExitedRank e;
    if (space == std::string_view::npos ||
        std::from_chars(line.data(), line.data() + space, e.rank).ec != std::errc())
      continue;
    e.how = std::string(line.substr(space + 1));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace lockstep::distributed
