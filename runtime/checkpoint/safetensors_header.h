// The safetensors header: encoding, decoding and validation.
//
// A safetensors file is
//   [8 bytes: N, little-endian u64] [N bytes: JSON header] [data]
// The JSON maps each tensor name to {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]} (offsets relative to the start of the data)
// and may hold "__metadata__": {string: string}. The header is padded with
// spaces to a multiple of 8, so the data starts 8-byte aligned. The tensors'
// byte ranges are contiguous and cover the whole data: the Python safetensors
// library refuses gaps, and so do we.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// safetensors refuses headers above 100 MB; so do we (a larger length field
// means a corrupt file or not a safetensors file at all).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// "F32", "BF16", "BOOL", ... for every lockstep dtype.
std::string_view safetensors_dtype(DType dtype);
// The lockstep dtype of a safetensors dtype name; nullopt for names lockstep
// does not have (I8, I16, U16, F8_E4M3, ...).
std::optional<DType> dtype_from_safetensors(std::string_view name);

struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // in data order (by begin offset)
  std::map<std::string, std::string> metadata;
  uint64_t header_bytes = 0;  // N: the JSON and its padding

  uint64_t data_offset() const { return 8 + header_bytes; }
  uint64_t data_bytes() const { return tensors.empty() ? 0 : tensors.back().end; }
  uint64_t file_bytes() const { return data_offset() + data_bytes(); }
};

// The length prefix and the padded JSON header for `tensors` laid out in the
// given order (the begin/end fields of the entries are ignored and recomputed).
std::string encode_safetensors_header(const std::vector<TensorEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata);

// Parses and validates the JSON header (`json` is the N bytes after the length
// prefix). `file` names the file in errors. Checks every entry's dtype, shape
// and byte count and that the ranges are contiguous from 0; it does not know
// the file size (see check_data_size).
SafetensorsHeader decode_safetensors_header(std::string_view json, const std::string& file);

// Errors when the data section the header describes does not match the file's
// size: truncated files and trailing bytes.
void check_data_size(const SafetensorsHeader& header, uint64_t file_size, const std::string& file);

}  // namespace lockstep::runtime
