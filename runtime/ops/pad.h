// pad2d: torch.nn.functional.pad over the last two dims (H, W), with
// PyTorch's modes. Built from slices, expand and cat, so it is differentiable
// and runs on every device they run on.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// zeros: constant 0. reflect: mirrored without repeating the edge (pad < size).
// replicate: the edge repeated (size > 0). circular: wrapped around (pad <= size).
enum class PadMode { zeros, reflect, replicate, circular };

// PyTorch's spelling: "zeros", "reflect", "replicate", "circular".
std::string_view pad_mode_name(PadMode mode);

// x of 2 or more dims; pad = {left, right, top, bottom}, F.pad's order for
// the last two dims, each >= 0. Refuses, naming the padding, the dim and the
// input's shape, a reflect padding >= that dim's size, a circular one larger
// than it, and replicate of an empty dim.
Tensor pad2d(const Tensor& x, std::array<int64_t, 4> pad, PadMode mode = PadMode::zeros);

}  // namespace lockstep::runtime
