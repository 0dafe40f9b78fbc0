// Why two lists of tensor names do not pair up, when it is one segment put in
// every name of one side: a wrapper's "module." (DistributedDataParallel,
// DataParallel), torch.compile's "_orig_mod.", a training checkpoint's
// "model.", at the front of each name or after a head they share
// ("model.module.fc.weight" where "model.fc.weight" was expected). Load
// errors name it, so that a user sees the wrapper, not "another model".
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lockstep::runtime {

struct NameInsertion {
  std::string head;      // what comes before the segment: "" (the front) or "model."
  std::string segment;   // "module."
  bool in_found = false; // the found names have it, else the expected ones
  size_t count = 0;      // the names it pairs up
  size_t of = 0;         // the names of the side without it
};

// The insertion that pairs up the most of `missing` (expected, not found) and
// `unexpected` (found, not expected): it must pair up all of one side, or at
// least half of the smaller one; none when two different ones pair up as
// many (it would be a guess). `front_only`: only segments at the front.
std::optional<NameInsertion> name_insertion(const std::vector<std::string>& missing,
                                            const std::vector<std::string>& unexpected,
                                            bool front_only = false);

}  // namespace lockstep::runtime
