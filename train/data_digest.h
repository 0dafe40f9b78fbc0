// An identity of the data a run trains and validates on, as loaded: a run's
// checkpoints record it among the fixed settings (kDataDigestSetting,
// run_settings.h), so a resume on files that changed under the same path (a
// package upgrade, another filter, another dataset of the same shape) is
// refused instead of silently training on other data.
//
//   train::DataDigest d;
//   d.add("train.x", train.x()).add("train.y", train.y());  // each split, named
//   settings.fixed[train::kDataDigestSetting] = train::same_on_every_rank(d, path, group);
//
// runtime::hash_bytes over each part's name, dtype, shape and bytes, in the
// order added: the same on every machine and build, and GB/s, so a dataset
// of a few hundred MB costs tens of milliseconds next to its loading. For
// telling data apart, not for security.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::train {

class DataDigest {
 public:
  // A tensor's dtype, shape and values (on any device, any layout).
  DataDigest& add(std::string_view part, const runtime::Tensor& t);
  // Bytes, such as a text corpus's split.
  DataDigest& add(std::string_view part, std::string_view bytes);

  // 16 hex digits.
  std::string hex() const;

 private:
  uint64_t h_ = 0;
};

// Every rank calls it. Returns d.hex(), the same on every rank; throws on
// every rank, naming each rank's digest and `path`, when the ranks loaded
// different data (another version of the files on another node).
std::string same_on_every_rank(const DataDigest& d, const std::string& path,
                               collectives::ProcessGroup& group);

}  // namespace lockstep::train
