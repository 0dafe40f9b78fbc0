// Parameter partitioning for sharded optimizers (ZeroRedundancyOptimizer).
// Two rules; both are deterministic (every rank computes the same answer from
// the same sizes, with no communication and no randomness).
//
// Whole parameters, partition_parameters(): "largest first to the least
// loaded". Sort the parameters by size, largest first (ties: lower index
// first), and give each to the rank whose load so far is smallest (ties: the
// lower rank). A rank can never hold less than the largest parameter, so
// balance needs a model of many similar layers (one layer holding half the
// weights leaves one rank with half the state). With fewer parameters than
// ranks, some ranks own nothing.
//
// Split parameters, partition_elements(): the parameters of one space (the
// caller passes the dtype) are laid end to end in index order, each as its
// flat (row-major) elements: T elements in all. Rank r owns the range
// [floor(r*T/N), floor((r+1)*T/N)) of that line, so every rank holds
// floor(T/N) or ceil(T/N) elements of every space. A parameter crossing a
// range boundary is cut into pieces; a rank owns at most one piece of each
// parameter. A parameter without elements is one empty piece on rank 0.
// With fewer elements than ranks, some ranks own nothing.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::optim {

// A contiguous range of one parameter's flat elements and the rank owning it.
struct Piece {
  int64_t param = 0;  // parameter index
  int64_t begin = 0;  // [begin, end) of its flat elements
  int64_t end = 0;
  int owner = 0;

  int64_t numel() const { return end - begin; }
  bool operator==(const Piece&) const = default;
};

struct Partition {
  // owner[i]: the rank holding all of parameter i; -1 when it is cut over
  // several ranks (see pieces).
  std::vector<int> owner;
  std::vector<std::vector<int64_t>> params_of;  // params_of[r]: parameters with a piece on r, ascending
  std::vector<int64_t> load;                    // load[r]: the sum of rank r's sizes
  // Every piece, by parameter then begin; a whole parameter is one piece
  // [0, numel). Empty only for a parameter without elements.
  std::vector<Piece> pieces;

  // The largest load over the mean load (1 is perfect balance; 0 for nothing).
  double imbalance() const;
  bool operator==(const Partition&) const = default;
};

// `sizes[i]`: parameter i's weight (bytes, or elements), >= 0. `numels[i]`:
// its element count, the end of its piece (empty: sizes[i]).
Partition partition_parameters(const std::vector<int64_t>& sizes, int world_size,
                               const std::vector<int64_t>& numels = {});

// `numels[i]`: parameter i's element count, >= 0; `spaces[i]`: its space
// (parameters of equal spaces share one line). load counts elements.
Partition partition_elements(const std::vector<int64_t>& numels, const std::vector<int>& spaces,
                             int world_size);

}  // namespace lockstep::optim
