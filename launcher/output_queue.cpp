#include "launcher/output_queue.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace lockstep::launcher {

bool same_file(int a, int b) {
  struct stat sa {}, sb {};
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

OutputQueue::OutputQueue(int fd) : fd_(fd) {
  struct stat st {};
  const bool known = fstat(fd, &st) == 0;
  if (known && (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) return;
  if (known && S_ISSOCK(st.st_mode)) {
    socket_ = true;
    return;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int own = open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (own >= 0) {
    fd_ = own;
    own_fd_ = true;
    return;
  }
  // No /proc, or a pipe whose reader is gone (ENXIO): the next write says so.
  saved_flags_ = fcntl(fd, F_GETFL);
  if (saved_flags_ >= 0) fcntl(fd, F_SETFL, saved_flags_ | O_NONBLOCK);
}

OutputQueue::~OutputQueue() {
  if (own_fd_) close(fd_);
  else if (saved_flags_ >= 0) fcntl(fd_, F_SETFL, saved_flags_);
}

void OutputQueue::push(std::string_view data) {
  if (closed_ || data.empty()) return;
  pending_.append(data);
  flush();
}

void OutputQueue::flush() {
  while (!empty() && !closed_) {
    const char* data = pending_.data() + offset_;
    const size_t size = pending_.size() - offset_;
    const ssize_t n = socket_ ? send(fd_, data, size, MSG_DONTWAIT | MSG_NOSIGNAL)
                              : write(fd_, data, size);
    if (n > 0) {
      offset_ += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      break;
    } else {
      closed_ = true;  // e.g. EPIPE: nobody reads our output any more
      discard();
    }
  }
  // Keep the buffer from growing by what was written already.
  if (offset_ > 0 && (empty() || offset_ >= pending_.size() / 2)) {
    pending_.erase(0, offset_);
    offset_ = 0;
  }
}

void OutputQueue::discard() {
  pending_.clear();
  offset_ = 0;
}

}  // namespace lockstep::launcher
