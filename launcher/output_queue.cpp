#include "launcher/output_queue.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

namespace lockstep::launcher {

OutputQueue::OutputQueue(int fd) : fd_(fd), saved_flags_(fcntl(fd, F_GETFL)) {
  if (saved_flags_ >= 0) fcntl(fd, F_SETFL, saved_flags_ | O_NONBLOCK);
}

// The flags belong to the open file, which the shell that started us shares.
OutputQueue::~OutputQueue() {
  if (saved_flags_ >= 0) fcntl(fd_, F_SETFL, saved_flags_);
}

void OutputQueue::push(std::string_view data) {
  if (closed_ || data.empty()) return;
  pending_.append(data);
  flush();
}

void OutputQueue::flush() {
  while (!empty() && !closed_) {
    const ssize_t n = write(fd_, pending_.data() + offset_, pending_.size() - offset_);
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
