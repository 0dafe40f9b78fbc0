#include "lockstep/runtime/cpu/scratch.h"

#include <array>
#include <cstdlib>
#include <new>

namespace lockstep::runtime::cpu {
namespace {

struct Buffer {
  void* data = nullptr;
  size_t capacity = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data); }
};

}  // namespace

void* scratch_bytes(ScratchSlot slot, size_t bytes) {
  thread_local std::array<Buffer, static_cast<size_t>(ScratchSlot::kCount)> buffers;
  Buffer& b = buffers[static_cast<size_t>(slot)];
  if (bytes > b.capacity) {
    // Round up so that slowly growing requests do not reallocate every call.
    size_t cap = ((bytes + bytes / 4) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, cap);
    if (p == nullptr) throw std::bad_alloc();
    std::free(b.data);
    b.data = p;
    b.capacity = cap;
  }
  return b.data;
}

}  // namespace lockstep::runtime::cpu
