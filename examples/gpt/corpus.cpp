#include "corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/random.h"

namespace gpt_example {

namespace fs = std::filesystem;
using lockstep::runtime::Tensor;

Corpus load_fortunes(const std::string& dir) {
  LOCKSTEP_CHECK(fs::is_directory(dir),
                 "no fortune databases at {}: install them with `apt-get install fortunes` "
                 "(scripts/setup does), or point --data at a directory of fortune files",
                 dir);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    // The index beside it is what makes a database, whatever its name:
    // "a.dat" and "a.u8" have none, and "my.quotes" is one with "my.quotes.dat".
    const fs::path& p = e.path();
    if (!e.is_regular_file()) continue;
    if (fs::exists(fs::path(p).concat(".dat"))) files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  LOCKSTEP_CHECK(!files.empty(),
                 "{} holds no fortune database (a file with its .dat index beside it)", dir);
  Corpus c;
  c.files = static_cast<int64_t>(files.size());
  int64_t entry = 0;
  // Some fortunes appear in more than one file (or twice in one): each is
  // counted once, where it first appears, so no held-out entry is trained on.
  std::unordered_set<std::string> seen;
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    LOCKSTEP_CHECK(in.good(), "cannot read {}", p.string());
    std::string line, text;
    const auto finish = [&] {
      if (text.empty() || !seen.insert(text).second) {
        text.clear();
        return;
      }
      const bool held_out = ++entry % 10 == 0;
      (held_out ? c.validation : c.train) += text + "%\n";
      ++(held_out ? c.validation_entries : c.train_entries);
      text.clear();
    };
    while (std::getline(in, line)) {
      if (line == "%") {
        finish();
      } else {
        text += line + "\n";
      }
    }
    finish();
  }
  LOCKSTEP_CHECK(!c.validation.empty(),
                 "{} holds {} fortune entries, too few to hold out every 10th for validation",
                 dir, c.train_entries);
  return c;
}

double unigram_bits_per_byte(const std::string& train, const std::string& text) {
  std::array<double, 256> counts{};
  counts.fill(1.0);
  for (const char ch : train) counts[static_cast<unsigned char>(ch)] += 1.0;
  const double total = static_cast<double>(train.size()) + 256.0;
  double bits = 0;
  for (const char ch : text) bits -= std::log2(counts[static_cast<unsigned char>(ch)] / total);
  return text.empty() ? 0.0 : bits / static_cast<double>(text.size());
}

TokenBatch windows_at(const std::string& text, const std::vector<int64_t>& offsets, int64_t t) {
  const auto rows = static_cast<int64_t>(offsets.size());
  std::vector<int64_t> x(static_cast<size_t>(rows * t)), y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = offsets[static_cast<size_t>(r)];
    LOCKSTEP_CHECK(at >= 0 && at + t + 1 <= static_cast<int64_t>(text.size()),
                   "a window of {} bytes at {} does not fit a text of {} bytes", t + 1, at,
                   text.size());
    for (int64_t i = 0; i < t; ++i) {
      x[static_cast<size_t>(r * t + i)] = static_cast<unsigned char>(text[static_cast<size_t>(at + i)]);
      y[static_cast<size_t>(r * t + i)] = static_cast<unsigned char>(text[static_cast<size_t>(at + i + 1)]);
    }
  }
  return {Tensor::from_vector(x, {rows, t}), Tensor::from_vector(y, {rows, t})};
}

void check_window_fits(const std::string& text, const char* split, int64_t t) {
  LOCKSTEP_CHECK(static_cast<int64_t>(text.size()) >= t + 1,
                 "the {} text ({} bytes) is shorter than one window of {} bytes (--seq-len {} "
                 "and the byte after it); use a shorter --seq-len",
                 split, text.size(), t + 1, t);
}

TokenBatch train_batch(const std::string& text, int64_t step, int rank, int world, int64_t rows,
                       int64_t t, uint64_t seed) {
  check_window_fits(text, "training", t);
  const auto starts = static_cast<uint64_t>(text.size()) - static_cast<uint64_t>(t);
  std::vector<int64_t> offsets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<uint64_t>((step * world + rank) * rows + r);
    uint32_t draws[2];
    lockstep::runtime::philox_u32(seed, 2 * row, draws, 2);
    const uint64_t draw = (static_cast<uint64_t>(draws[0]) << 32) | draws[1];
    offsets[static_cast<size_t>(r)] = static_cast<int64_t>(draw % starts);
  }
  return windows_at(text, offsets, t);
}

int64_t window_count(const std::string& text, int64_t t) {
  return std::max<int64_t>(0, static_cast<int64_t>(text.size()) - t);
}

std::vector<int64_t> evaluation_offsets(const std::string& text, int64_t count, int64_t t) {
  check_window_fits(text, "validation", t);
  count = std::min(count, window_count(text, t));
  const int64_t last = static_cast<int64_t>(text.size()) - t - 1;
  std::vector<int64_t> offsets;
  for (int64_t w = 0; w < count; ++w)
    offsets.push_back(count == 1 ? 0 : last * w / (count - 1));
  return offsets;
}

}  // namespace gpt_example
