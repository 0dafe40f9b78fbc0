#include "lockstep/runtime/checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/liveness.h"

namespace lockstep::runtime {

void throw_errno(const std::string& what, const std::string& file) {
  const int err = errno;
  throw Error(fmt::format("{} {}: {}", what, file, std::strerror(err)));
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void UniqueFd::close(const std::string& file) {
  const int fd = release();
  if (fd >= 0 && ::close(fd) != 0) throw_errno("cannot close", file);
}

// Opening and reading a checkpoint of many GB on slow storage is progress,
// not a hang, however little CPU it uses (runtime/liveness.h); writing is
// marked so where the file is written (atomic_file.cpp).
UniqueFd open_for_read(const std::string& path) {
  const BusyScope opening;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw Error(fmt::format("{}: no such file", path));
    throw_errno("cannot open", path);
  }
  return UniqueFd(fd);
}

uint64_t file_size(int fd, const std::string& file) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("cannot stat", file);
  return static_cast<uint64_t>(st.st_size);
}

void write_all(int fd, const void* data, size_t n, const std::string& file) {
  auto p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno(fmt::format("write failed after {} of {} bytes:", done, n), file);
    }
    done += static_cast<size_t>(w);
  }
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& file) {
  auto p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno(fmt::format("write at byte {} failed:", offset + done), file);
    }
    done += static_cast<size_t>(w);
  }
}

void pread_all(int fd, void* data, size_t n, uint64_t offset, const std::string& file) {
  const BusyScope reading;
  auto p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno(fmt::format("read at byte {} failed:", offset + done), file);
    }
    if (r == 0)
      throw Error(
          fmt::format("{}: the file ends at byte {}, expected {} more bytes (truncated "
                      "while being read?)",
                      file, offset + done, n - done));
    done += static_cast<size_t>(r);
  }
}

void fsync_or_throw(int fd, const std::string& file) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) throw_errno("fsync failed for", file);
  }
}

}  // namespace lockstep::runtime
