#include "lockstep/runtime/cuda/core/caching_allocator_core.h"

#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "lockstep/runtime/cuda/core/error_context.h"

namespace lockstep::runtime::cuda {

std::size_t round_allocation_size(std::size_t bytes) {
  if (bytes <= kMinBlockSize) return kMinBlockSize;
  if (bytes <= kSmallSize) return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

// One contiguous piece of a segment. The blocks of a segment form a doubly
// linked list in address order (prev == nullptr: the segment's start).
namespace {

struct Block {
  int device = 0;
  StreamKey stream = nullptr;  // the stream whose cache the block belongs to
  std::size_t size = 0;
  void* ptr = nullptr;
  bool small = false;       // from a small (2 MiB) segment
  bool allocated = false;   // handed out by allocate()
  bool in_pool = false;     // cached and reusable (free, no pending events)
  std::size_t requested = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<StreamKey> uses;  // other streams, from record_stream()
  int pending_events = 0;       // events still to complete before reuse
};

// Free blocks ordered by (stream, size, address): lower_bound on (stream, n)
// finds the smallest block of that stream holding n bytes.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return std::less<StreamKey>()(a->stream, b->stream);
    if (a->size != b->size) return a->size < b->size;
    return std::less<void*>()(a->ptr, b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

struct PendingEvent {
  EventKey event;
  Block* block;
};

struct DeviceState {
  Pool small;
  Pool large;
  std::vector<PendingEvent> pending;
  AllocatorStats stats;
};

}  // namespace

struct CachingAllocatorCore::Impl {
  AllocatorBackend& backend;
  std::string name;
  mutable std::mutex mutex;
  std::map<int, DeviceState> devices;
  std::unordered_map<const void*, Block*> blocks;  // every block, by its start

  Impl(AllocatorBackend& b, std::string n) : backend(b), name(std::move(n)) {}

  Block* allocated_block(const void* ptr, const char* op) const {
    const auto it = blocks.find(ptr);
    if (it == blocks.end()) {
      throw Error(fmt::format("{} allocator: {} of {}: not the start of a block from this "
                              "allocator (a foreign pointer, or one freed already)",
                              name, op, ptr));
    }
    if (!it->second->allocated) {
      throw Error(fmt::format("{} allocator: {} of {}: the block was freed already (double free)",
                              name, op, ptr));
    }
    return it->second;
  }

  static Pool& pool_of(DeviceState& d, const Block* b) { return b->small ? d.small : d.large; }

  Block* take_from_pool(Pool& pool, StreamKey stream, std::size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    const auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool.erase(it);
    b->in_pool = false;
    return b;
  }

  // Makes a freed block reusable, merged with free neighbours of its segment.
  void return_to_pool(DeviceState& d, Block* b) {
    Pool& pool = pool_of(d, b);
    if (Block* p = b->prev; p != nullptr && p->in_pool) {
      pool.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      blocks.erase(b->ptr);
      delete b;
      b = p;
    }
    if (Block* n = b->next; n != nullptr && n->in_pool) {
      pool.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      blocks.erase(n->ptr);
      delete n;
    }
    b->in_pool = true;
    pool.insert(b);
  }

  // Returns blocks whose events have all completed to the pool. Never blocks.
  void process_events(DeviceState& d) {
    auto keep = d.pending.begin();
    for (auto it = d.pending.begin(); it != d.pending.end(); ++it) {
      if (!backend.event_completed(it->event)) {
        *keep++ = *it;
        continue;
      }
      backend.destroy_event(it->event);
      if (--it->block->pending_events == 0) {
        --d.stats.pending_blocks;
        return_to_pool(d, it->block);
      }
    }
    d.pending.erase(keep, d.pending.end());
  }

  // Waits for every event of the device's freed blocks, which then return to
  // the pool (only when out of memory: the host blocks on other streams).
  void wait_pending(DeviceState& d) {
    for (const PendingEvent& p : d.pending) backend.wait_event(p.event);
    process_events(d);
  }

  // Returns every cached whole segment of `device` to the backend; the bytes.
  std::size_t release_cached(int device, DeviceState& d) {
    std::size_t released = 0;
    for (Pool* pool : {&d.small, &d.large}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev != nullptr || b->next != nullptr) {
          ++it;
          continue;
        }
        backend.deallocate(device, b->ptr);
        it = pool->erase(it);
        released += b->size;
        d.stats.reserved_bytes -= b->size;
        ++d.stats.backend_frees;
        blocks.erase(b->ptr);
        delete b;
      }
    }
    return released;
  }

  [[noreturn]] void throw_oom(int device, const DeviceState& d, std::size_t bytes,
                              std::size_t rounded, std::size_t segment, std::size_t released) {
    const AllocatorStats& s = d.stats;
    std::string memory = backend.describe_memory(device);
    if (!memory.empty()) memory = "; " + memory;
    throw OutOfMemoryError(fmt::format(
        "{} out of memory on {}, device {}: cannot allocate {} (a {} block in a {} "
        "segment), even after returning {} of cached memory and retrying. This process has "
        "{} allocated in {} blocks and {} reserved ({} cached or fragmented), {} freed blocks "
        "waiting for other streams, peak allocated {}, {} segments allocated{}. Reduce the batch "
        "or model size, drop references to tensors no longer needed, or check (nvidia-smi) "
        "that no other process uses this device.",
        name, process_rank_text(), device, format_bytes(bytes),
        format_bytes(rounded), format_bytes(segment), format_bytes(released),
        format_bytes(s.allocated_bytes), s.active_blocks, format_bytes(s.reserved_bytes),
        format_bytes(s.reserved_bytes - s.allocated_bytes), s.pending_blocks,
        format_bytes(s.peak_allocated_bytes), s.backend_allocs, memory));
  }
};

CachingAllocatorCore::CachingAllocatorCore(AllocatorBackend& backend, std::string name)
    : impl_(std::make_unique<Impl>(backend, std::move(name))) {}

CachingAllocatorCore::~CachingAllocatorCore() {
  Impl& m = *impl_;
  try {
    for (auto& [device, d] : m.devices) {
      for (const PendingEvent& p : d.pending) m.backend.destroy_event(p.event);
    }
    for (auto& [ptr, b] : m.blocks) {
      if (b->prev == nullptr) m.backend.deallocate(b->device, b->ptr);
    }
  } catch (const std::exception& e) {
    std::cerr << "lockstep: warning: " << m.name << " allocator: releasing memory at exit failed: "
              << e.what() << std::endl;
  }
  for (auto& [ptr, b] : m.blocks) delete b;
}

void* CachingAllocatorCore::allocate(int device, std::size_t bytes, StreamKey stream) {
  Impl& m = *impl_;
  LOCKSTEP_CHECK(device >= 0, "{} allocator: device index {} is negative", m.name, device);
  // Beyond any memory, and rounding it up would wrap around to a small size.
  if (bytes > kMaxRequest) {
    throw OutOfMemoryError(fmt::format(
        "{} allocator: a request of {} bytes on device {} is larger than any device's memory; "
        "the size was probably computed from a negative or overflowing number",
        m.name, bytes, device));
  }
  std::lock_guard lock(m.mutex);
  DeviceState& d = m.devices[device];
  m.process_events(d);

  const std::size_t size = round_allocation_size(bytes);
  const bool small = size <= kSmallSize;
  Pool& pool = small ? d.small : d.large;
  Block* block = m.take_from_pool(pool, stream, size);
  if (block != nullptr) {
    ++d.stats.cache_hits;
  } else {
    const std::size_t segment = small ? kSmallSegment : size;
    void* ptr = m.backend.allocate(device, segment);
    if (ptr == nullptr) {
      ++d.stats.oom_retries;
      m.wait_pending(d);
      const std::size_t released = m.release_cached(device, d);
      ptr = m.backend.allocate(device, segment);
      if (ptr == nullptr) m.throw_oom(device, d, bytes, size, segment, released);
    }
    ++d.stats.backend_allocs;
    d.stats.reserved_bytes += segment;
    d.stats.peak_reserved_bytes = std::max(d.stats.peak_reserved_bytes, d.stats.reserved_bytes);
    block = new Block{.device = device, .stream = stream, .size = segment, .ptr = ptr,
                      .small = small};
    m.blocks.emplace(ptr, block);
  }

  // Split off the rest when it is worth keeping as a block of its own.
  const std::size_t rest = block->size - size;
  if (small ? rest >= kMinBlockSize : rest > kSmallSize) {
    auto* tail = new Block{.device = device, .stream = stream, .size = rest,
                           .ptr = static_cast<char*>(block->ptr) + size, .small = small};
    tail->prev = block;
    tail->next = block->next;
    if (block->next) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    m.blocks.emplace(tail->ptr, tail);
    tail->in_pool = true;
    pool.insert(tail);
  }

  block->allocated = true;
  block->requested = bytes;
  AllocatorStats& s = d.stats;
  s.allocated_bytes += block->size;
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  s.requested_bytes += bytes;
  ++s.allocations;
  ++s.active_blocks;
  return block->ptr;
}

void CachingAllocatorCore::free(void* ptr) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  Block* b = m.allocated_block(ptr, "free");
  DeviceState& d = m.devices[b->device];
  // The events first: should recording one fail, the block stays allocated
  // (lost to the cache, never handed out while another stream may use it).
  std::vector<EventKey> events;
  try {
    for (StreamKey stream : b->uses) events.push_back(m.backend.record_event(b->device, stream));
  } catch (...) {
    for (EventKey e : events) {
      try {
        m.backend.destroy_event(e);
      } catch (const std::exception&) {  // the first error is the one to report
      }
    }
    throw;
  }
  b->uses.clear();
  b->allocated = false;
  d.stats.allocated_bytes -= b->size;
  d.stats.requested_bytes -= b->requested;
  --d.stats.active_blocks;
  if (events.empty()) {
    m.return_to_pool(d, b);
    return;
  }
  ++d.stats.pending_blocks;
  for (EventKey e : events) d.pending.push_back({e, b});
  b->pending_events += static_cast<int>(events.size());
}

void CachingAllocatorCore::record_stream(void* ptr, StreamKey stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  Block* b = m.allocated_block(ptr, "record_stream");
  if (stream == b->stream) return;
  for (StreamKey s : b->uses) {
    if (s == stream) return;
  }
  b->uses.push_back(stream);
}

void CachingAllocatorCore::empty_cache(int device) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  for (auto& [index, d] : m.devices) {
    if (device >= 0 && index != device) continue;
    m.process_events(d);
    m.release_cached(index, d);
  }
}

AllocatorStats CachingAllocatorCore::stats(int device) const {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->devices.find(device);
  return it == impl_->devices.end() ? AllocatorStats{} : it->second.stats;
}

void CachingAllocatorCore::reset_peak_stats(int device) {
  std::lock_guard lock(impl_->mutex);
  AllocatorStats& s = impl_->devices[device].stats;
  s.peak_allocated_bytes = s.allocated_bytes;
  s.peak_reserved_bytes = s.reserved_bytes;
}

std::size_t CachingAllocatorCore::block_size(const void* ptr) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->allocated_block(ptr, "block_size")->size;
}

int CachingAllocatorCore::block_device(const void* ptr) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->allocated_block(ptr, "block_device")->device;
}

}  // namespace lockstep::runtime::cuda
