// Checkpoint files: a set of named tensors plus string metadata, in one
// safetensors file (Python reads the weights with the safetensors library or
// scripts/read_checkpoint.py) carrying CRC-32 checksums.
//
//   CheckpointContent c{.tensors = model.state_dict().items(),
//                       .metadata = {{"epoch", "3"}}};
//   save_checkpoint("ckpt/model.safetensors", c);       // rank 0 only
//   CheckpointContent back = load_checkpoint("ckpt/model.safetensors",
//                                            {.device = my_device});
//   check_tensors_match(back.tensors, model.state_dict().items(), path);
//
// Saving is atomic (see atomic_file.h): a crash mid-write leaves any previous
// file at that path intact. Loading verifies the checksums and the layout and
// throws lockstep::Error naming the file, the tensor and what to do. For a
// directory of numbered checkpoints with retention, see checkpoint_dir.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "lockstep/runtime/checkpoint/safetensors.h"

namespace lockstep::runtime {

struct CheckpointContent {
  NamedTensors tensors;  // unique names; any device, any layout
  std::map<std::string, std::string> metadata;
};

struct SaveOptions {
  // Called after each large write with (bytes written, file size).
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

// Writes `content` to `path` atomically and durably (fsync of file and
// directory). Returns the file's size in bytes.
uint64_t save_checkpoint(const std::filesystem::path& path, const CheckpointContent& content,
                         const SaveOptions& options = {});

struct LoadOptions {
  Device device = Device::cpu();  // where the tensors go (read to CPU, then moved)
  bool require_checksum = true;   // false: also accept plain safetensors files
};

// Reads and verifies a checkpoint. Tensors come back contiguous, in file
// order; the checksum entries are dropped from the metadata once verified.
CheckpointContent load_checkpoint(const std::filesystem::path& path,
                                  const LoadOptions& options = {});

// Throws one error listing every difference between the tensors a checkpoint
// holds (`found`) and those the caller expects, e.g. a model's state_dict:
// missing and unexpected names, and shape or dtype mismatches (expected vs
// found). `file` names the checkpoint in the message.
void check_tensors_match(const NamedTensors& found, const NamedTensors& expected,
                         const std::string& file);

}  // namespace lockstep::runtime
