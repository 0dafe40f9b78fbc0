#include "lockstep/runtime/cuda/core/error_context.h"

#include <atomic>

#include <fmt/format.h>

namespace lockstep::runtime::cuda {
namespace {

std::atomic<int> g_rank{-1};

}  // namespace

int process_rank() { return g_rank.load(std::memory_order_acquire); }

void set_process_rank(int rank) { g_rank.store(rank, std::memory_order_release); }

std::string process_rank_text() {
  const int rank = process_rank();
  return rank >= 0 ? fmt::format("rank {}", rank) : std::string("rank ?");
}

std::string library_error_message(std::string_view library, std::string_view expr,
                                  std::string_view file, int line, std::string_view detail) {
  return fmt::format("{} error on {} at {}:{}: {} failed: {}", library, process_rank_text(), file,
                     line, expr, detail);
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
