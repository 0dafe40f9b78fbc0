// The text gpt_train learns: the fortune databases of Debian's `fortunes`
// package, read as bytes (a byte-level model: 256 tokens, no tokenizer).
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/runtime/tensor.h"

namespace gpt_example {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct Corpus {
  std::string train, validation;
  int64_t files = 0;
  int64_t train_entries = 0, validation_entries = 0;
};

// Every fortune database in `dir` (a file with its ".dat" index beside it),
// in name order. Entries end at lines holding only "%"; an entry that
// repeats an earlier one is skipped, and every 10th entry (the 10th, 20th,
// ... over all files in that order) is held out for validation, so the
// held-out text shares no entry with the training text. Each split is its
// entries, each followed by "%\n" as in the files. Throws, naming the
// directory, when there is nothing to read.
Corpus load_fortunes(const std::string& dir);

// Bits per byte of `text` under the byte frequencies of `train` (add-one
// smoothing): the unigram baseline a language model must beat.
double unigram_bits_per_byte(const std::string& train, const std::string& text);

// Throws, naming the split, when `text` is shorter than one window of
// `t` + 1 bytes (checked before the model is built, which a huge `t` makes slow).
void check_window_fits(const std::string& text, const char* split, int64_t t);

struct TokenBatch {
  lockstep::runtime::Tensor x, y;  // i64 [rows, t]; y is x shifted by one byte
};

// `rank`'s `rows` training windows of `t` + 1 bytes for `step`. Window r of
// rank k starts at an offset drawn from a Philox stream keyed by `seed` at
// position 2 * (step * world * rows + k * rows + r): a step's batch is the
// same whenever it is made, so a resumed run sees what an uninterrupted one
// would, and no two rows of a step share their draw.
TokenBatch train_batch(const std::string& text, int64_t step, int rank, int world, int64_t rows,
                       int64_t t, uint64_t seed);

// The windows of `t` + 1 bytes starting at `offsets`.
TokenBatch windows_at(const std::string& text, const std::vector<int64_t>& offsets, int64_t t);

// How many distinct windows of `t` + 1 bytes `text` holds.
int64_t window_count(const std::string& text, int64_t t);

// `count` window starts spread evenly over `text` (the validation set), or
// every start where `text` holds fewer windows: none is counted twice.
std::vector<int64_t> evaluation_offsets(const std::string& text, int64_t count, int64_t t);

}  // namespace gpt_example
