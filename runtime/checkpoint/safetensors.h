// Reading and writing safetensors files, with lockstep's checksums.
//
// Checksums live in the header's "__metadata__", so any safetensors reader
// still loads the file:
//   "lockstep.checksum":     "crc32:xxxxxxxx", the CRC-32 of the whole file
//                            with these 8 hex digits read as "00000000";
//   "lockstep.tensor_crc32": one 8-hex-digit CRC-32 per tensor, comma
//                            separated, in data order, so that corrupt data
//                            is reported with the tensor it hit.
// The writer streams the tensors' memory straight to the file in large
// writes and computes the CRCs on the way (no copy of the data), then
// rewrites the header, whose length does not change, with the final values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/runtime/checkpoint/safetensors_header.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

inline constexpr const char* kChecksumKey = "lockstep.checksum";
inline constexpr const char* kTensorChecksumsKey = "lockstep.tensor_crc32";

struct SafetensorsWriteOptions {
  // Called after each large write with the bytes written so far and the file's
  // total size: progress reports, and tests that interrupt a write.
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

// Writes `tensors` (any device, any layout; copied only where not contiguous
// CPU memory) and `metadata` to `fd`, an empty file open for writing, from
// offset 0. `file` names it in errors. The two checksum keys above are
// reserved. Does not fsync. Returns the bytes written.
uint64_t write_safetensors(int fd, const std::string& file, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SafetensorsWriteOptions& options = {});

// The same to the file at `path`, replaced atomically and durably
// (atomic_file.h): readers see the old file or the whole new one. What
// save_checkpoint() does with a CheckpointContent.
uint64_t write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SafetensorsWriteOptions& options = {});

struct SafetensorsReadOptions {
  // Our checkpoints always carry checksums; turn this off to read a plain
  // safetensors file (written by Python, say), verifying checksums if present.
  bool require_checksum = true;
};

struct SafetensorsFile {
  NamedTensors tensors;  // CPU, contiguous, in data order
  std::map<std::string, std::string> metadata;
};

// Reads and verifies a whole file: header, sizes and checksums. Every error
// names the file and, where one is to blame, the tensor.
SafetensorsFile read_safetensors(const std::string& path,
                                 const SafetensorsReadOptions& options = {});

// The validated header alone (names, dtypes, shapes, metadata): cheap, for
// listing checkpoints. Whether the data is all there is not checked, nor any
// checksum: a file cut off after its header still says whose it is.
SafetensorsHeader read_safetensors_header(const std::string& path);

}  // namespace lockstep::runtime
