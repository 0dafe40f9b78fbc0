// Counter-based random numbers (Philox4x32-10): the value at position i of the
// stream depends only on (seed, i), so every process that uses the same seed
// and draws in the same order gets the same values, on any machine.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

class Generator;

namespace detail {
// While installed on a thread (activation checkpointing), every reservation
// that thread makes goes through it: recorded in a forward, replayed in a
// recomputation so that it draws exactly what the forward drew.
class DrawLog {
 public:
  virtual ~DrawLog() = default;
  virtual uint64_t reserve(Generator& g, uint64_t n) = 0;
  // Before g's seed or position is set (manual_seed, set_offset, assignment),
  // and when g is destroyed, on this thread.
  virtual void setting(Generator& /*g*/) {}
  virtual void destroying(Generator& /*g*/) {}
};
DrawLog* current_draw_log();
void set_current_draw_log(DrawLog* log);

// Installs a DrawLog on this thread until destroyed, then the one before.
class DrawLogScope {
 public:
  explicit DrawLogScope(DrawLog* log) : previous_(current_draw_log()) {
    set_current_draw_log(log);
  }
  ~DrawLogScope() { set_current_draw_log(previous_); }
  DrawLogScope(const DrawLogScope&) = delete;
  DrawLogScope& operator=(const DrawLogScope&) = delete;

 private:
  DrawLog* previous_;
};
}  // namespace detail

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  Generator(const Generator& other) : seed_(other.seed_), offset_(other.offset()) {}
  Generator& operator=(const Generator& other);
  ~Generator();
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  // Position in the stream, in 32-bit draws; save and restore it to resume.
  uint64_t offset() const { return offset_.load(); }
  void set_offset(uint64_t offset);
  // Takes the next n draws of the stream for the caller: returns their first
  // position and moves past them. Threads drawing from one generator at once
  // get disjoint draws (DataParallel's replicas: replica_draws.h).
  uint64_t reserve(uint64_t n);
  // reserve() without the thread's DrawLog.
  uint64_t take(uint64_t n) { return offset_.fetch_add(n); }

  // The next n 32-bit draws of the stream.
  void fill_u32(uint32_t* out, size_t n);
  uint32_t next_u32();
  double next_uniform();  // in [0, 1), 53 random bits

 private:
  uint64_t seed_;
  std::atomic<uint64_t> offset_{0};
};

// The n 32-bit draws at positions [at, at + n) of the stream of `seed`, with
// no generator: how a kernel redraws what it took earlier with
// Generator::reserve (attention's dropout mask, redrawn in backward).
void philox_u32(uint64_t seed, uint64_t at, uint32_t* out, size_t n);

// The process-wide generator used when none is passed.
Generator& default_generator();
void manual_seed(uint64_t seed);

// In-place fills, under no-grad. Floating tensors only. uniform_'s values lie
// in [lo, hi) in t's dtype, as PyTorch's (rand() never gives 1.0).
Tensor& uniform_(Tensor& t, double lo = 0.0, double hi = 1.0, Generator& g = default_generator());
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator& g = default_generator());

// fan_in, fan_out as PyTorch computes them: [out, in, k...] -> (in*k, out*k).
std::pair<int64_t, int64_t> fan_in_and_out(const Shape& shape);
// PyTorch's kaiming_uniform_(mode=fan_in, nonlinearity=leaky_relu, a).
// a = sqrt(5) is what nn.Linear and nn.Conv2d use by default. These four
// leave a tensor of no elements as it is, as PyTorch's do.
Tensor& kaiming_uniform_(Tensor& t, double a = 0.0, Generator& g = default_generator());
Tensor& kaiming_normal_(Tensor& t, double a = 0.0, Generator& g = default_generator());
Tensor& xavier_uniform_(Tensor& t, double gain = 1.0, Generator& g = default_generator());
Tensor& xavier_normal_(Tensor& t, double gain = 1.0, Generator& g = default_generator());

Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator& g = default_generator());
Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator& g = default_generator());
// A permutation of 0..n-1 (Fisher-Yates driven by g).
std::vector<int64_t> randperm(int64_t n, Generator& g = default_generator());

}  // namespace lockstep::runtime
