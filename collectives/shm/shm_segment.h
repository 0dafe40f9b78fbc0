// A POSIX shared-memory segment (/dev/shm) that one process creates and
// others map, with the bookkeeping that keeps /dev/shm clean.
//
// Names are "/lockstep-<uid>-<rest>". The creator stamps the segment with its
// pid and process start time, so a later job can tell a live segment from a
// stale one left by a crashed job (its creator gone, or its pid reused):
// create() removes stale segments of this user before it creates, and
// replaces a stale segment that holds the very name it wants.
#pragma once

#include <cstddef>
#include <string>

namespace lockstep::collectives::shm {

// "lockstep-<uid>-": the /dev/shm file-name prefix of this user's segments.
std::string segment_prefix();

// Removes this user's segments whose creator has exited; returns how many.
size_t remove_stale_segments();

class Segment {
 public:
  // Creates `name` ("/lockstep-<uid>-...") of `bytes` zeroed bytes and maps it.
  // Throws if a live process's segment holds the name.
  static Segment create(const std::string& name, size_t bytes);
  // Maps an existing segment; throws naming it when it is missing (another
  // node?) or smaller than `bytes`.
  static Segment open(const std::string& name, size_t bytes);

  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  ~Segment();

  // Removes the name; the mapping stays valid until destruction.
  void unlink();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void reset();  // unlink if still linked, unmap

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;
};

}  // namespace lockstep::collectives::shm
