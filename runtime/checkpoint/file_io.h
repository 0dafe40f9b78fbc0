// POSIX file I/O for checkpoints: an owning file descriptor and whole-buffer
// reads and writes that retry short transfers and EINTR, and throw
// lockstep::Error naming the file and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::runtime {

// Owns a file descriptor; closes it (ignoring errors) when destroyed.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();
  // close() with its error checked (a failed close can lose written data).
  void close(const std::string& file);

 private:
  int fd_ = -1;
};

// Opens for reading; "no such file" or the system's reason on failure.
UniqueFd open_for_read(const std::string& path);
uint64_t file_size(int fd, const std::string& file);

// Writes all n bytes at the current position.
void write_all(int fd, const void* data, size_t n, const std::string& file);
// Writes all n bytes at `offset`.
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& file);
// Reads exactly n bytes at `offset`; an error if the file ends first.
void pread_all(int fd, void* data, size_t n, uint64_t offset, const std::string& file);
void fsync_or_throw(int fd, const std::string& file);

// "<what> <file>: <strerror(errno)>" as an Error, errno read at the call.
[[noreturn]] void throw_errno(const std::string& what, const std::string& file);

}  // namespace lockstep::runtime
