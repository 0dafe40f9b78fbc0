#include "lockstep/distributed/rank_postmortem.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lockstep/distributed/flight_recorder.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/postmortem.h"
#include "lockstep/runtime/cuda/core/error_context.h"

namespace lockstep::distributed {
namespace {

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("?");
}

// "allreduce #12 (f32, 1000 elements) of group 'default' failed"; the part
// says which rank it is, so causes alike read as one in the report.
std::string failed_call_text(const FlightRecord& r) {
  const std::string what =
      r.dtype.empty() ? fmt::format("{} #{}", r.op, r.seq)
                      : fmt::format("{} #{} ({}, {} elements)", r.op, r.seq, r.dtype, r.count);
  return fmt::format("{} of group '{}' failed", what, r.group);
}

}  // namespace

std::optional<std::string> write_rank_postmortem(const runtime::EnvLookup& env,
                                                 const std::string& cause) {
  const auto dir = env(kPostmortemDirVariable);
  if (!dir || dir->empty()) return std::nullopt;
  // Under lockstep-run the launcher reads the recorder's file itself (the
  // variable is read, then unset, when the recorder is made).
  if (env("LOCKSTEP_FLIGHT_RECORDER") || FlightRecorder::instance().in_launcher_file())
    return std::nullopt;
  int rank = runtime::cuda::process_rank();
  int world_size = 0;
  try {
    const RankInfo info = read_rank_info(env, {.allow_missing_store = true});
    rank = info.rank;
    world_size = info.world_size;
  } catch (const std::exception&) {
    // The group was made somehow; the rank it runs as is known to the runtime.
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  Postmortem pm{.cause = cause,
                .written_unix_s = std::chrono::duration<double>(now).count(),
                .world_size = world_size};
  pm.ranks.push_back(rank_history(FlightRecorder::instance().snapshot(), monotonic_ns(),
                                  std::max(rank, 0), 0, host_name(), ::getpid()));
  const auto path =
      (std::filesystem::path(*dir) / fmt::format("lockstep-postmortem-rank{}.json", rank)).string();
  std::ofstream out(path);
  out << to_json_text(pm, 1) << "\n";
  out.close();
  if (!out) {
    fmt::print(stderr, "lockstep: rank {} could not write its post-mortem to {}: {}\n", rank,
               path, std::strerror(errno));
    return std::nullopt;
  }
  fmt::print(stderr,
             "lockstep: rank {}'s last collectives are in {} (lockstep-run --postmortem-from {} "
             "reports every rank's)\n",
             rank, path, *dir);
  return path;
}

void on_collective_failed(uint64_t ordinal) {
  static std::atomic<bool> written{false};
  const auto& env = runtime::process_env();
  const auto dir = env(kPostmortemDirVariable);
  if (!dir || dir->empty() || written.exchange(true)) return;
  std::string cause = "a collective failed";
  for (const auto& r : FlightRecorder::instance().snapshot()) {
    if (r.ordinal == ordinal) cause = failed_call_text(r);
  }
  try {
    write_rank_postmortem(env, cause);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep: could not write this rank's post-mortem: {}\n", e.what());
  }
}

}  // namespace lockstep::distributed
