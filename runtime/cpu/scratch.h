// Per-thread, grow-only scratch memory for CPU kernel workspaces (im2col
// columns, packed temporaries).
//
// A fresh page costs about 2 us on first touch, so a workspace allocated per
// call can cost more than the arithmetic it feeds. A slot keeps its largest
// allocation for the life of the thread; later requests of the same or a
// smaller size reuse the already-touched pages.
//
// Contract: the pointer stays valid until the next scratch() call with the
// same slot on the same thread. A kernel that needs two buffers at once uses
// two slots. Contents are unspecified (not zeroed).
#pragma once

#include <cstddef>

namespace lockstep::runtime::cpu {

enum class ScratchSlot : int { kA = 0, kB = 1, kC = 2, kCount = 3 };

// At least `bytes` bytes, 64-byte aligned.
void* scratch_bytes(ScratchSlot slot, size_t bytes);

template <class T>
T* scratch(ScratchSlot slot, size_t count) {
  return static_cast<T*>(scratch_bytes(slot, count * sizeof(T)));
}

}  // namespace lockstep::runtime::cpu
