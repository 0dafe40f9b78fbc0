// Reader for IDX files, the format of MNIST and Fashion-MNIST
// (https://yann.lecun.com/exdb/mnist/): a 4-byte magic 0x00 0x00 <type> <ndims>,
// ndims big-endian uint32 dimensions, then the elements, big-endian, row-major.
//
// The file may be plain or gzip-compressed; which one is decided by the gzip
// magic bytes, not by the file name. Every malformed input (missing, truncated,
// wrong magic, zero or oversized dimensions, short data, trailing bytes, corrupt
// gzip stream) is a lockstep::Error that names the file and the problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// The element type codes of the format.
enum class IdxType : uint8_t {
  u8 = 0x08,
  i8 = 0x09,
  i16 = 0x0B,
  i32 = 0x0C,
  f32 = 0x0D,
  f64 = 0x0E,
};

std::string_view idx_type_name(IdxType t);  // "u8", "i8", ...
size_t idx_type_size(IdxType t);            // bytes per element

struct IdxArray {
  IdxType type = IdxType::u8;
  Shape dims;
  // dims[0] as the header gives it: more than dims[0] after a read of the
  // first rows (IdxReadOptions::max_rows), so files that should pair up can
  // still be compared whole.
  int64_t file_rows = 0;
  // The elements, row-major, each already converted to this machine's byte
  // order: for IdxType::f32 the bytes are floats, and so on.
  std::vector<uint8_t> bytes;

  int64_t numel() const { return shape_numel(dims); }
};

struct IdxReadOptions {
  // Refuse files whose header describes more data than this. The default
  // leaves room for any MNIST-like set while a corrupt header cannot make us
  // allocate or inflate without bound.
  uint64_t max_bytes = uint64_t{4} << 30;
  // Read only the first `max_rows` entries along dimension 0 (dims[0] becomes
  // the smaller of the two): a quick run on the first N samples of a big file
  // inflates and converts only those. The header is checked as for a whole
  // read; the rows after them are neither read nor checked.
  uint64_t max_rows = UINT64_MAX;
};

// Reads an IDX file (plain or gzip): all of it, or its first rows.
IdxArray read_idx(const std::string& path, const IdxReadOptions& options = {});

// The array as a CPU tensor of shape `dims`: u8 -> u8, i8/i16/i32 -> i32,
// f32 -> f32, f64 -> f64 (the tensor library has no i8 or i16).
Tensor idx_to_tensor(const IdxArray& array);

}  // namespace lockstep::runtime
