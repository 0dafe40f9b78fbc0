// Helpers for the checkpoint tests: tensors with arbitrary bit patterns,
// byte-level comparison, and file surgery (truncation, bit flips).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/data_test_util.h"  // TempDir
#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::testing {

// The steps of the checkpoints a directory lists, in its order.
inline std::vector<int64_t> steps(const runtime::CheckpointDir& d) {
  std::vector<int64_t> s;
  for (const auto& e : d.list()) s.push_back(e.step);
  return s;
}

// A tensor of `shape` whose bytes are pseudo-random (bool: 0 or 1), so a
// round trip is checked on every bit, NaN payloads included.
inline runtime::Tensor random_tensor(const runtime::Shape& shape, runtime::DType dtype,
                                     uint32_t seed = 1) {
  runtime::Tensor t = runtime::Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  const size_t n = t.numel() * t.element_size();
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>(dtype == runtime::DType::boolean ? rng() & 1u : rng());
  return t;
}

// The tensor's elements in row-major order as raw bytes.
inline std::string bytes_of(const runtime::Tensor& t) {
  runtime::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.numel() * c.element_size());
}

inline bool same_tensor(const runtime::Tensor& a, const runtime::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && bytes_of(a) == bytes_of(b);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

inline void flip_bit(const std::string& path, uint64_t offset, int bit = 0) {
  std::string b = read_bytes(path);
  b.at(offset) = static_cast<char>(b.at(offset) ^ (1 << bit));
  write_bytes(path, b);
}

// The 8-byte length prefix plus the JSON header: where the data starts.
inline uint64_t data_offset_of(const std::string& path) {
  std::string b = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return 8 + n;
}

// A small model-like checkpoint: a few parameters of mixed sizes.
inline runtime::CheckpointContent small_content(uint32_t seed = 1) {
  using runtime::DType;
  runtime::CheckpointContent c;
  c.tensors = {{"fc1.weight", random_tensor({16, 8}, DType::f32, seed)},
               {"fc1.bias", random_tensor({16}, DType::f32, seed + 1)},
               {"fc2.weight", random_tensor({4, 16}, DType::f32, seed + 2)},
               {"step_count", random_tensor({}, DType::i64, seed + 3)}};
  c.metadata = {{"epoch", "3"}, {"model", "mlp"}};
  return c;
}

}  // namespace lockstep::testing
