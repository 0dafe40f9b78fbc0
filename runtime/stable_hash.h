// stable_hash: FNV-1a over bytes. Unlike std::hash it is the same in every
// build and on every machine, so ranks can each derive the same value (a
// port, a token) from the same text without talking to each other.
#pragma once

#include <cstdint>
#include <string_view>

namespace lockstep::runtime {

constexpr uint64_t stable_hash(std::string_view text, uint64_t seed = 1469598103934665603ull) {
  uint64_t h = seed;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace lockstep::runtime
