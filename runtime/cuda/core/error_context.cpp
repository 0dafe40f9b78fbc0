#include "lockstep/runtime/cuda/core/error_context.h"

#include <atomic>
#include <climits>

#include <fmt/format.h>

#include "lockstep/runtime/env.h"

namespace lockstep::runtime::cuda {
namespace {

constexpr int kUnset = INT_MIN;
std::atomic<int> g_rank{kUnset};

int rank_from_environment() {
  try {
    return read_rank_info(process_env(), {.allow_missing_store = true}).rank;
  } catch (const std::exception&) {
    return -1;  // malformed launcher variables: init() reports those properly
  }
}

}  // namespace

int process_rank() {
  int rank = g_rank.load(std::memory_order_acquire);
  if (rank != kUnset) return rank;
  rank = rank_from_environment();
  int expected = kUnset;
  // A concurrent set_process_rank() wins over the environment.
  if (!g_rank.compare_exchange_strong(expected, rank, std::memory_order_acq_rel)) return expected;
  return rank;
}

void set_process_rank(int rank) { g_rank.store(rank, std::memory_order_release); }

std::string library_error_message(std::string_view library, std::string_view expr,
                                  std::string_view file, int line, std::string_view detail) {
  const int rank = process_rank();
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : std::string("rank ?");
  return fmt::format("{} error on {} at {}:{}: {} failed: {}", library, who, file, line, expr,
                     detail);
}

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

}  // namespace lockstep::runtime::cuda
