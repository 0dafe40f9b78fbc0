// --tag-output: what the launcher has for one of its own output streams
// (stdout or stderr) and could not write yet. It writes without blocking, so
// a reader that stalls (a paused `less`, a fifo nobody reads) holds up the
// ranks' output, not the launcher: the supervisor stops reading the ranks'
// pipes while the queue is full, which blocks the ranks' writes as it would
// without --tag-output. The stream's own flags stay as they are: they belong
// to an open file that the shell and whoever else writes there share, and a
// launcher killed with SIGKILL could not restore them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep::launcher {

// Whether descriptors `a` and `b` are one file (2>&1): one queue, and one
// pipe from each rank, keep the order of their lines.
bool same_file(int a, int b);

class OutputQueue {
 public:
  // Past this many bytes the queue is full: nothing more is read for it.
  static constexpr size_t kFullBytes = 1 << 20;

  // A pipe or terminal is opened anew, non-blocking (an open file of our
  // own); a socket is written with MSG_DONTWAIT; a regular file as it is
  // (writing one waits for no reader). Only where none of that works is
  // `fd` itself made non-blocking until destruction, which restores it.
  explicit OutputQueue(int fd);
  ~OutputQueue();
  OutputQueue(const OutputQueue&) = delete;
  OutputQueue& operator=(const OutputQueue&) = delete;

  int fd() const { return fd_; }
  // Queues `data` (whole lines, so that streams do not interleave mid-line)
  // and writes what the stream takes now.
  void push(std::string_view data);
  // Writes what the stream takes now, without blocking.
  void flush();
  bool empty() const { return pending_.size() == offset_; }
  bool full() const { return pending_.size() - offset_ >= kFullBytes; }
  // The stream's reader is gone (EPIPE): nothing pushed will be written.
  bool closed() const { return closed_; }
  size_t size() const { return pending_.size() - offset_; }
  // Drops what is queued (nobody will read it).
  void discard();

 private:
  int fd_;
  bool own_fd_ = false;  // fd_ is our reopened copy of the stream
  bool socket_ = false;
  int saved_flags_ = -1;  // the stream's flags, when we changed them
  bool closed_ = false;  // the reader is gone (EPIPE): pushed data is dropped
  std::string pending_;
  size_t offset_ = 0;  // what of pending_ was written already
};

}  // namespace lockstep::launcher
