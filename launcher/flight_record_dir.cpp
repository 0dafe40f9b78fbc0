#include "launcher/flight_record_dir.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "launcher/process_identity.h"
#include "lockstep/runtime/env.h"

namespace lockstep::launcher {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "lockstep-run-";

// Where a pid names the same process: this pid namespace, this boot.
struct Scope {
  uint64_t pid_namespace = 0;
  std::string boot_id;
};

Scope this_scope() {
  Scope scope;
  struct stat ns {};
  if (stat("/proc/self/ns/pid", &ns) == 0) scope.pid_namespace = ns.st_ino;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> scope.boot_id;
  return scope;
}

// "<pid> <start time> <pid namespace> <boot id>\n"
void write_owner(const fs::path& dir, const Scope& scope) {
  const pid_t pid = getpid();
  const auto start = process_start_time(pid);
  if (!start || scope.boot_id.empty() || scope.pid_namespace == 0) return;  // cannot be told
  // Written whole under another name, then renamed: a launcher sweeping at
  // the same moment reads all of it or none.
  const fs::path partial = dir / "owner.partial";
  std::ofstream(partial) << fmt::format("{} {} {} {}\n", pid, *start, scope.pid_namespace,
                                        scope.boot_id);
  std::error_code ignored;
  fs::rename(partial, dir / "owner", ignored);
}

// Whether `dir`'s launcher is known to be gone.
bool owner_gone(const fs::path& dir, const Scope& scope) {
  std::ifstream in(dir / "owner");
  int64_t pid = 0;
  uint64_t start = 0, pid_namespace = 0;
  std::string boot_id;
  if (!(in >> pid >> start >> pid_namespace >> boot_id) || pid <= 0) return false;
  if (pid_namespace != scope.pid_namespace || boot_id != scope.boot_id) return false;
  return !process_alive(static_cast<pid_t>(pid), start);
}

// Removes this user's directories beside ours whose launcher is gone.
void remove_stale(const fs::path& base, const fs::path& ours, const Scope& scope) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(base, error)) {
    const fs::path& dir = entry.path();
    struct stat st {};
    if (!dir.filename().string().starts_with(kPrefix) || dir == ours ||
        lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
      continue;
    if (!owner_gone(dir, scope)) continue;
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
}

}  // namespace

FlightRecorderFiles::FlightRecorderFiles() {
  // /dev/shm first (memory: the ranks write at every collective), then where
  // temporary files go, as mkstemp's callers look: TMPDIR, else /tmp.
  std::vector<std::string> bases = {"/dev/shm"};
  for (const std::string& base : {runtime::process_env()("TMPDIR").value_or(""),
                                  std::string("/tmp")}) {
    if (!base.empty() && std::find(bases.begin(), bases.end(), base) == bases.end())
      bases.push_back(base);
  }
  std::vector<std::string> failures;
  for (const std::string& base : bases) {
    std::string pattern = fmt::format("{}/{}XXXXXX", base, kPrefix);
    if (mkdtemp(pattern.data()) == nullptr) {
      failures.push_back(fmt::format("{}: {}", base, std::strerror(errno)));
      continue;
    }
    dir_ = fs::absolute(pattern).string();
    const Scope scope = this_scope();
    write_owner(dir_, scope);
    remove_stale(base, dir_, scope);
    return;
  }
  unavailable_ = fmt::format("cannot make a directory for them ({})", fmt::join(failures, "; "));
}

FlightRecorderFiles::~FlightRecorderFiles() {
  if (dir_.empty()) return;
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

std::string FlightRecorderFiles::path(int rank) const {
  return dir_.empty() ? std::string() : fmt::format("{}/rank-{}", dir_, rank);
}

void FlightRecorderFiles::clear() const {
  if (dir_.empty()) return;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir_, ignored)) {
    if (entry.path().filename() != "owner") fs::remove(entry.path(), ignored);
  }
}

}  // namespace lockstep::launcher
