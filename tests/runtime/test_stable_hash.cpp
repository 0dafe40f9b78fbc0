// stable_hash and hash_bytes: fixed values (the same in every build), and
// hash_bytes tells apart buffers that differ in any one bit or in length.
#include <catch2/catch.hpp>

#include <set>
#include <vector>

#include "lockstep/runtime/stable_hash.h"

using namespace lockstep::runtime;

TEST_CASE("stable_hash gives the same values in every build", "[hash]") {
  CHECK(stable_hash("") == 1469598103934665603ull);
  CHECK(stable_hash("a") == 0x44bd8ad473cd9906ull);
}

TEST_CASE("hash_bytes changes with any one bit, with the length, and only with them", "[hash]") {
  std::vector<unsigned char> buf(37);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 29 + 3);
  const uint64_t base = hash_bytes(buf.data(), buf.size());
  CHECK(hash_bytes(buf.data(), buf.size()) == base);
  std::set<uint64_t> seen{base};
  for (size_t byte = 0; byte < buf.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[byte] ^= static_cast<unsigned char>(1 << bit);
      seen.insert(hash_bytes(buf.data(), buf.size()));
      buf[byte] ^= static_cast<unsigned char>(1 << bit);
    }
  }
  CHECK(seen.size() == 1 + buf.size() * 8);  // every flip its own hash
  for (size_t n = 0; n < buf.size(); ++n) seen.insert(hash_bytes(buf.data(), n));
  CHECK(seen.size() == 1 + buf.size() * 8 + buf.size());  // and every prefix
  std::vector<unsigned char> zeros(16, 0);
  CHECK(hash_bytes(zeros.data(), 8) != hash_bytes(zeros.data(), 16));
}
