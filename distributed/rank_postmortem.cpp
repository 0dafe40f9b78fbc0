#include "lockstep/distributed/rank_postmortem.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

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

namespace fs = std::filesystem;

// How often a rank looks whether another rank asked for its part, and how
// long a rank that wrote the part of its failed collective waits for the
// others'. The look is one stat() of one file, cheap on a shared file system.
constexpr auto kWatchEvery = std::chrono::seconds(1);
constexpr auto kAnswerWait = std::chrono::seconds(2);
constexpr auto kAnswerPoll = std::chrono::milliseconds(100);
constexpr const char* kAskedFile = "lockstep-postmortem-asked";

// Where this process writes its part; nullopt when it writes none.
struct PartTarget {
  std::string dir;
  int rank = 0;
  int world_size = 0;  // 0: unknown
  std::string attempt;  // Postmortem::attempt
};

// Which launch and attempt this is, where the launcher says: torchrun and
// Slurm restart a job's ranks, and the new ranks write to the same directory.
// `source` is the launcher that started this rank (RankInfo::source; empty
// where unknown). Every rank of one launch must name it alike.
std::string attempt_of(const runtime::EnvLookup& env, const std::string& source) {
  if (const auto run = env("TORCHELASTIC_RUN_ID"))
    return fmt::format("torchrun run {}, restart {}", *run,
                       env("TORCHELASTIC_RESTART_COUNT").value_or("0"));
  // Open MPI's mpirun (and PRRTE's) names each launch's job so; two jobs
  // written to one directory are not one post-mortem. Inside a Slurm job an
  // mpirun's (or mpiexec's) ranks have the batch shell's SLURM_* on its node
  // and its daemons' step's on the others: those name no launch of theirs.
  // MPICH's hydra names none.
  const auto pmix_job = env("PMIX_NAMESPACE");
  if (source == "open-mpi" || source == "pmix")
    return pmix_job ? fmt::format("mpirun job {}", *pmix_job) : "";
  if (source == "pmi") return "";
  if (const auto job = env("SLURM_JOB_ID"))
    return fmt::format("slurm job {}, step {}, restart {}", *job,
                       env("SLURM_STEP_ID").value_or("?"),
                       env("SLURM_RESTART_COUNT").value_or("0"));
  if (pmix_job) return fmt::format("mpirun job {}", *pmix_job);
  return "";
}

std::optional<PartTarget> part_target(const runtime::EnvLookup& env) {
  const auto dir = env(kPostmortemDirVariable);
  if (!dir || dir->empty()) return std::nullopt;
  // Under lockstep-run the launcher reads the recorder's file itself (the
  // variable is read, then unset, when the recorder is made).
  if (env("LOCKSTEP_FLIGHT_RECORDER") || FlightRecorder::instance().in_launcher_file())
    return std::nullopt;
  PartTarget t{.dir = *dir, .rank = runtime::cuda::process_rank()};
  std::string source;
  try {
    const RankInfo info = read_rank_info(env, {.allow_missing_store = true});
    t.rank = info.rank;
    t.world_size = info.world_size;
    source = info.source;
  } catch (const std::exception&) {
    // The group was made somehow; the rank it runs as is known to the runtime.
  }
  t.attempt = attempt_of(env, source);
  t.rank = std::max(t.rank, 0);
  return t;
}

std::string part_path(const std::string& dir, int rank) {
  return (fs::path(dir) / fmt::format("lockstep-postmortem-rank{}.json", rank)).string();
}

// A part is written aside under this name and the writer's pid, then renamed.
std::string temp_prefix(int rank) {
  return fmt::format(".lockstep-postmortem-rank{}.json.{}.", rank, host_name());
}

// Removes what this rank's earlier processes on this host, killed between
// writing their part aside and renaming it, left in `dir`. Another host's
// pids mean nothing here, so its files are left alone.
void remove_stale_temps(const std::string& dir, const std::string& prefix) {
  std::error_code error;
  for (auto it = fs::directory_iterator(dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    pid_t pid = 0;
    const char* end = name.data() + name.size();
    const auto [rest, parsed] = std::from_chars(name.data() + prefix.size(), end, pid);
    if (parsed != std::errc() || rest != end || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

std::optional<std::string> write_part(const PartTarget& t, const std::string& cause) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  Postmortem pm{.cause = cause,
                .written_unix_s = std::chrono::duration<double>(now).count(),
                .world_size = t.world_size,
                .attempt = t.attempt};
  pm.ranks.push_back(rank_history(FlightRecorder::instance().snapshot(), monotonic_ns(), t.rank,
                                  0, host_name(), ::getpid()));
  const auto path = part_path(t.dir, t.rank);
  // Written aside and renamed: another launcher kills the ranks as soon as
  // one exits, and a part cut short would be a part nobody can read.
  const std::string prefix = temp_prefix(t.rank);
  remove_stale_temps(t.dir, prefix);
  const auto temp = (fs::path(t.dir) / fmt::format("{}{}", prefix, ::getpid())).string();
  std::ofstream out(temp);
  out << to_json_text(pm, 1) << "\n";
  out.close();
  if (!out || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    fmt::print(stderr, "lockstep: rank {} could not write its post-mortem to {}: {}\n", t.rank,
               path, std::strerror(error));
    return std::nullopt;
  }
  fmt::print(stderr,
             "lockstep: rank {}'s last collectives are in {} (lockstep-run --postmortem-from {} "
             "reports every rank's)\n",
             t.rank, path, t.dir);
  return path;
}

// What this process wrote: nothing yet, an answer to another rank's part, or
// the part of its own failed collective, which an answer never replaces.
enum class Written { nothing, answer, failure };
struct PartState {
  std::mutex mutex;  // one write at a time
  Written written = Written::nothing;
};
// Never destroyed: the watch thread may still run while the process exits.
PartState* part_state = new PartState;

// The watch of this process (nullptr: none), and whether it was decided.
struct Watch {
  PartTarget target;
  fs::file_time_type since;  // parts older than this are another job's
};
std::atomic<Watch*> the_watch{nullptr};
std::atomic<bool> watch_decided{false};

// How many ranks other than `self` wrote a part in dir since `since`.
int fresh_parts(const std::string& dir, int self, fs::file_time_type since) {
  int n = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    if (std::sscanf(name.c_str(), "lockstep-postmortem-rank%d.json", &rank) != 1 || rank == self)
      continue;
    std::error_code stat_error;
    const auto written = fs::last_write_time(entry.path(), stat_error);
    if (!stat_error && written >= since && name == fs::path(part_path(dir, rank)).filename())
      ++n;
  }
  return n;
}

// Whether a rank of `attempt` asked for the others' parts since `since`. The
// ask's first line names its launch (attempt_of): a rank of another job
// writing to the same directory at the same time is not answered, which
// would put this rank's part over that job's part of the same rank number.
bool asked_since(const std::string& dir, fs::file_time_type since, const std::string& attempt) {
  const fs::path file = fs::path(dir) / kAskedFile;
  std::error_code error;
  const auto written = fs::last_write_time(file, error);
  if (error || written < since) return false;
  std::string asker;
  std::getline(std::ifstream(file), asker);
  return attempt.empty() || asker.empty() || asker == attempt;
}

// Asks every rank watching dir for its part.
void ask_for_parts(const PartTarget& t, const std::string& cause) {
  std::ofstream(fs::path(t.dir) / kAskedFile)
      << fmt::format("{}\nrank {}: {}\n", t.attempt, t.rank, cause);
}

// The watch thread: once a rank asks, write this one's part, so that a rank
// stuck outside the collectives says where it is.
void run_watch(const Watch& w) {
  for (;;) {
    std::this_thread::sleep_for(kWatchEvery);
    if (!asked_since(w.target.dir, w.since, w.target.attempt)) continue;
    std::lock_guard lock(part_state->mutex);
    if (part_state->written == Written::nothing && write_part(w.target, ""))
      part_state->written = Written::answer;
    return;
  }
}

// Until every other rank's part is there, or kAnswerWait has passed.
void wait_for_answers(const Watch& w) {
  if (w.target.world_size <= 1) return;
  const auto deadline = std::chrono::steady_clock::now() + kAnswerWait;
  while (fresh_parts(w.target.dir, w.target.rank, w.since) < w.target.world_size - 1 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(kAnswerPoll);
}

}  // namespace

std::optional<std::string> write_rank_postmortem(const runtime::EnvLookup& env,
                                                 const std::string& cause) {
  const auto target = part_target(env);
  if (!target) return std::nullopt;
  return write_part(*target, cause);
}

void watch_for_postmortems() {
  if (watch_decided.load(std::memory_order_acquire)) return;
  static std::mutex* deciding = new std::mutex;
  std::lock_guard lock(*deciding);
  if (watch_decided.load(std::memory_order_relaxed)) return;
  // A forked child (lockstep::spawn's ranks) is another rank: it has no
  // watch thread, and decides, watches and writes on its own.
  static const bool at_fork = ::pthread_atfork(nullptr, nullptr, [] {
    the_watch.store(nullptr);
    watch_decided.store(false);
    new (&part_state->mutex) std::mutex();  // no parent thread holds it here
    part_state->written = Written::nothing;
  }) == 0;
  (void)at_fork;
  // Every watch made stays reachable (a forked child's parent's among them).
  static auto* watches = new std::vector<std::unique_ptr<Watch>>;
  try {
    if (const auto target = part_target(runtime::process_env())) {
      Watch* w = watches->emplace_back(new Watch{*target, fs::file_time_type::clock::now()}).get();
      the_watch.store(w);
      std::thread([w] { run_watch(*w); }).detach();
    }
  } catch (const std::exception& e) {
    the_watch.store(nullptr);
    fmt::print(stderr, "lockstep: this rank will not answer other ranks' post-mortems: {}\n",
               e.what());
  }
  watch_decided.store(true, std::memory_order_release);
}

void on_collective_failed(uint64_t ordinal) {
  std::optional<PartTarget> target;
  try {
    target = part_target(runtime::process_env());
    if (!target) return;
    std::lock_guard lock(part_state->mutex);
    if (part_state->written == Written::failure) return;
    part_state->written = Written::failure;
    std::string cause = "a collective failed";
    for (const auto& r : FlightRecorder::instance().snapshot()) {
      if (r.ordinal == ordinal) cause = failed_call_text(r);
    }
    if (!write_part(*target, cause)) return;
    ask_for_parts(*target, cause);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep: could not write this rank's post-mortem: {}\n", e.what());
    return;
  }
  // Another launcher ends the job as soon as this rank exits: first give the
  // others, a rank stuck in its own code among them, a moment to answer.
  if (const Watch* w = the_watch.load()) wait_for_answers(*w);
}

}  // namespace lockstep::distributed
