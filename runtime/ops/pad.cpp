#include "lockstep/runtime/ops/pad.h"

#include <vector>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/misc.h"

namespace lockstep::runtime {

std::string_view pad_mode_name(PadMode mode) {
  switch (mode) {
    case PadMode::zeros: return "zeros";
    case PadMode::reflect: return "reflect";
    case PadMode::replicate: return "replicate";
    case PadMode::circular: return "circular";
  }
  return "?";
}

namespace {

// Refuses, naming x's shape, a padding that mode cannot take from dim d.
void check_fits(const Tensor& x, int64_t d, int64_t before, int64_t after, PadMode mode) {
  if (before == 0 && after == 0) return;
  const int64_t n = x.size(d);
  const bool fits = mode == PadMode::reflect     ? before < n && after < n
                    : mode == PadMode::circular  ? before <= n && after <= n
                    : mode == PadMode::replicate ? n > 0
                                                 : true;
  LOCKSTEP_CHECK(fits,
                 "pad2d: {} padding ({}, {}) does not fit dim {} of input {}: {}",
                 pad_mode_name(mode), before, after, d, shape_str(x.shape()),
                 mode == PadMode::reflect    ? "reflect needs each padding < the dim's size"
                 : mode == PadMode::circular ? "circular needs each padding <= the dim's size "
                                               "(it would wrap around more than once)"
                                             : "replicate needs a non-empty dim");
}

// x padded by `before` and `after` entries along dim d: the pieces around x
// are slices of x (or zeros), joined by cat, whose backward sums each
// piece's gradient back into the entries it was taken from.
Tensor pad_dim(const Tensor& x, int64_t d, int64_t before, int64_t after, PadMode mode) {
  if (before == 0 && after == 0) return x;
  const int64_t n = x.size(d);
  auto piece = [&](int64_t count, bool first) {
    Shape s = x.shape();
    s[d] = count;
    switch (mode) {
      case PadMode::zeros: return Tensor::zeros(s, x.dtype(), x.device());
      case PadMode::replicate:
        return (first ? x.slice(d, 0, 1) : x.slice(d, n - 1, n)).expand(s);
      case PadMode::circular: return first ? x.slice(d, n - count, n) : x.slice(d, 0, count);
      case PadMode::reflect: {
        // Before: entries count, count-1, ..., 1; after: n-2, n-3, ..., n-1-count.
        std::vector<Tensor> mirrored;
        for (int64_t j = 0; j < count; ++j) {
          const int64_t i = first ? count - j : n - 2 - j;
          mirrored.push_back(x.slice(d, i, i + 1));
        }
        return cat(mirrored, d);
      }
    }
    return Tensor();
  };
  std::vector<Tensor> parts;
  if (before > 0) parts.push_back(piece(before, true));
  parts.push_back(x);
  if (after > 0) parts.push_back(piece(after, false));
  return cat(parts, d);
}

}  // namespace

Tensor pad2d(const Tensor& x, std::array<int64_t, 4> pad, PadMode mode) {
  LOCKSTEP_CHECK(x.dim() >= 2, "pad2d: pads the last two dims, so the input needs 2 or more "
                 "dims, got {}", shape_str(x.shape()));
  LOCKSTEP_CHECK(pad[0] >= 0 && pad[1] >= 0 && pad[2] >= 0 && pad[3] >= 0,
                 "pad2d: padding (left, right, top, bottom) must be >= 0, got ({}, {}, {}, {})",
                 pad[0], pad[1], pad[2], pad[3]);
  const int64_t h = x.dim() - 2, w = x.dim() - 1;
  check_fits(x, w, pad[0], pad[1], mode);
  check_fits(x, h, pad[2], pad[3], mode);
  return pad_dim(pad_dim(x, w, pad[0], pad[1], mode), h, pad[2], pad[3], mode);
}

}  // namespace lockstep::runtime
