// Size2: an (h, w) pair for kernel sizes, strides and padding that also takes
// one integer for both, as PyTorch's _pair does: Conv2d(1, 32, 3) or
// Conv2d(1, 32, {3, 5}); in options, `.padding = 1`.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace lockstep::nn {

struct Size2 {
  int64_t h = 0;
  int64_t w = 0;

  Size2(int64_t both) : h(both), w(both) {}  // implicit on purpose: `3` means (3, 3)
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}

  std::array<int64_t, 2> arr() const { return {h, w}; }
  bool square() const { return h == w; }
  std::string str() const { return fmt::format("({}, {})", h, w); }
  // "2" when both are equal, else "(2, 3)": how PyTorch prints an int argument.
  std::string short_str() const { return square() ? std::to_string(h) : str(); }
  bool operator==(const Size2&) const = default;
};

}  // namespace lockstep::nn
