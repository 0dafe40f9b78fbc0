#include "lockstep/runtime/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>

#include "lockstep/runtime/checkpoint/file_io.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempMarker = ".tmp-";

// The pid in ".<name>.tmp-<pid>-<n>", or 0 when the name is not one of ours.
pid_t temp_file_pid(std::string_view name) {
  if (name.empty() || name[0] != '.') return 0;
  const size_t at = name.rfind(kTempMarker);
  if (at == std::string_view::npos || at < 2) return 0;
  const char* begin = name.data() + at + kTempMarker.size();
  const char* end = name.data() + name.size();
  pid_t pid = 0;
  auto [p, ec] = std::from_chars(begin, end, pid);
  if (ec != std::errc() || pid <= 0 || p == end || *p != '-') return 0;
  unsigned seq = 0;
  auto [q, ec2] = std::from_chars(p + 1, end, seq);
  return ec2 == std::errc() && q == end ? pid : 0;
}

}  // namespace

bool is_temp_file_name(std::string_view name) { return temp_file_pid(name) != 0; }

void fsync_directory(const fs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw_errno("cannot open directory", dir.string());
  fsync_or_throw(fd.get(), dir.string());
}

void write_file_atomically(const fs::path& path,
                           const std::function<void(int fd, const std::string& temp_path)>& fill) {
  // The sequence number keeps two threads of one process apart.
  static std::atomic<unsigned> sequence{0};
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string temp = (dir / fmt::format(".{}{}{}-{}", path.filename().string(), kTempMarker,
                                              ::getpid(), sequence++))
                               .string();
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) throw_errno("cannot create temporary checkpoint file", temp);
  try {
    fill(fd.get(), temp);
    fsync_or_throw(fd.get(), temp);
    fd.close(temp);
    if (::rename(temp.c_str(), path.c_str()) != 0)
      throw_errno(fmt::format("cannot rename {} to", temp), path.string());
  } catch (...) {
    fd.reset();
    ::unlink(temp.c_str());
    throw;
  }
  fsync_directory(dir);
}

std::vector<fs::path> remove_stale_temp_files(const fs::path& dir) {
  std::vector<fs::path> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const pid_t pid = temp_file_pid(entry.path().filename().string());
    if (pid == 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running (or not ours to ask)
    if (fs::remove(entry.path(), ec)) removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace lockstep::runtime
