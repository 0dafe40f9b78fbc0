// Scaled dot-product attention, differentiable: the semantics of PyTorch 2.x's
// torch.nn.functional.scaled_dot_product_attention,
//
//   out = dropout(softmax(q @ k^T * scale + mask)) @ v
//
// On the CPU a blocked (FlashAttention-style) kernel that holds the [L, S]
// attention weights one 64 x 64 tile at a time, forward and backward; on
// other devices, for now, the composed math path below.
#pragma once

#include <optional>

#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct AttentionOptions {
  // Optional, broadcastable to [..., L, S]: bool (true = may attend) or an
  // additive mask of q's dtype (-inf = may not attend). It gets no gradient:
  // one that requires grad is refused while grad mode is on.
  Tensor mask;
  // Query i attends keys j <= i (top-left aligned, PyTorch's is_causal).
  // Cannot be combined with `mask`: put the causal part into the mask.
  bool causal = false;
  // Probability of dropping each attention weight, in [0, 1); applied
  // whenever > 0 (pass 0 in eval, as in PyTorch). Kept weights are scaled by
  // 1 / (1 - p).
  double dropout = 0.0;
  std::optional<double> scale;     // of the scores; default 1 / sqrt(E)
  Generator* generator = nullptr;  // for dropout; default_generator() when null
};

// q [..., L, E], k [..., S, E], v [..., S, Ev] -> [..., L, Ev]. The leading
// dims (any number, none included) must be equal across q, k and v: they are
// not broadcast. One floating dtype and one device for all three; on the CPU,
// f32 or f64. E and Ev must be at least 1.
//
// A query whose keys are all masked out gets output 0 and zero gradients on
// both paths (PyTorch's math path gives NaN there).
//
// Dropout takes L * S draws per head from the generator, in one block: the
// weight of (head b, query i, key j), heads numbered row-major over the
// leading dims, is kept when the draw at position start + (b * L + i) * S + j
// is below (1 - p) * 2^32, as dropout() decides. Both paths make the same
// mask from the same generator state (unless another thread draws from that
// generator during the call).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// The same computation composed from differentiable ops (matmul, softmax,
// dropout, ...), materialising the whole [..., L, S] weight matrix: the
// reference, and the path on devices without an attention kernel.
Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionOptions& options = {});

// Self-attention over q, k and v packed side by side, as a fused [C, 3C]
// projection makes them: qkv [B, T, 3C] (C a multiple of num_heads) ->
// [B, T, C], head h's output in columns [h * C / H, (h + 1) * C / H). The
// same values, gradients and dropout draws as attention_from_qkv_composed
// below. On the CPU (f32, f64) the blocked kernel takes q, k and v apart in
// one pass, writes the heads' outputs straight into their columns, and
// backward returns one [B, T, 3C] gradient where three slices' backward
// would add three zero-padded ones; elsewhere it is the composition.
Tensor attention_from_qkv(const Tensor& qkv, int64_t num_heads,
                          const AttentionOptions& options = {});

// qkv split into three [B, H, T, C / H] views, scaled_dot_product_attention,
// and the heads merged back into [B, T, C]: the reference, and the path on
// devices without the blocked kernel.
Tensor attention_from_qkv_composed(const Tensor& qkv, int64_t num_heads,
                                   const AttentionOptions& options = {});

}  // namespace lockstep::runtime
