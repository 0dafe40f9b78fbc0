// A plain driver for store_frame_fuzz.cpp that any compiler builds: runs
// LLVMFuzzerTestOneInput on hand-written seeds and on deterministic random
// mutations of them, so the fuzz target's checks run in every ctest run.
//
//   store_frame_fuzz_replay [iterations] [file...]
// Files (e.g. crash inputs saved by libFuzzer) are replayed first.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "lockstep/distributed/store/detail/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace proto = lockstep::distributed::store_protocol;

namespace {

using Input = std::vector<uint8_t>;

// Valid frame streams, each prefixed by the chunk-size byte the target reads.
std::vector<Input> seeds() {
  const std::string i64 = proto::encode_i64(1000);
  std::vector<std::vector<std::pair<proto::MessageType, std::vector<std::string_view>>>> streams = {
      {{proto::MessageType::Auth, {"token"}}, {proto::MessageType::Set, {"key", "value"}}},
      {{proto::MessageType::Get, {"key", i64}}, {proto::MessageType::NumKeys, {}}},
      {{proto::MessageType::Wait, {i64, "a", "b", "c"}}, {proto::MessageType::Ok, {"x"}}},
      {{proto::MessageType::CompareSet, {"k", "", "new"}},
       {proto::MessageType::Add, {"n", i64}},
       {proto::MessageType::Delete, {"k"}},
       {proto::MessageType::Error, {"message"}},
       {proto::MessageType::Timeout, {}}}};
  std::vector<Input> out;
  uint8_t chunk = 0;
  for (const auto& stream : streams) {
    Input input{chunk++};
    for (const auto& [type, fields] : stream) proto::append_frame(input, type, fields);
    out.push_back(input);
  }
  out.push_back({3, 'G', 'E', 'T', ' ', '/'});
  out.push_back({0, 'L', 'K', 'S', '1', 2, 0xff, 0xff, 0xff, 0xff});
  return out;
}

// Flips, overwrites, inserts, erases or duplicates a few bytes.
Input mutate(Input input, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = input.empty() ? 0 : rng() % input.size();
    switch (rng() % 5) {
      case 0:
        if (!input.empty()) input[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (!input.empty()) input[at] = static_cast<uint8_t>(rng());
        break;
      case 2:
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(rng()));
        break;
      case 3:
        if (!input.empty()) input.erase(input.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      default: {
        const size_t n = std::min<size_t>(input.size() - at, 1 + rng() % 16);
        Input copy(input.begin() + static_cast<std::ptrdiff_t>(at),
                   input.begin() + static_cast<std::ptrdiff_t>(at + n));
        input.insert(input.end(), copy.begin(), copy.end());
      }
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 20000;
  for (int i = 2; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    Input input((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  const auto corpus = seeds();
  for (const auto& seed : corpus) LLVMFuzzerTestOneInput(seed.data(), seed.size());
  std::mt19937_64 rng(20240601);  // fixed: every run replays the same inputs
  for (long i = 0; i < iterations; ++i) {
    Input input = mutate(corpus[static_cast<size_t>(i) % corpus.size()], rng);
    // Stack a few mutations now and then to get further from the seeds.
    for (int extra = static_cast<int>(rng() % 3); extra > 0; --extra) input = mutate(input, rng);
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("store_frame_fuzz_replay: %zu seeds and %ld mutations parsed without a failure\n",
              corpus.size(), iterations);
  return 0;
}
