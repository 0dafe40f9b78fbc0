// CPU kernels behind scaled_dot_product_attention: a blocked forward with an
// online softmax, and a backward that recomputes each tile of the attention
// weights from the forward's per-row logsumexp (FlashAttention-2). Raw
// pointers over contiguous data; attention.cpp does the checking and the
// autograd wiring. The algorithm is described in attention_kernels.cpp.
#pragma once

#include <cstdint>

namespace lockstep::runtime::attention_kernels {

// q [bh, l, e], k [bh, s, e], v [bh, s, ev]; out [bh, l, ev]; bh = heads
// (every leading dim) together.
struct Dims {
  int64_t bh = 0, l = 0, s = 0, e = 0, ev = 0;
};

// Where row `row` of head b of the output (and of its gradient) starts, in
// elements: the heads split as [bh / inner, inner], each with its own stride,
// and the rows have theirs (each row's ev values contiguous). Contiguous
// [bh, l, ev] is {1, l * ev, 0, ev}; heads written side by side into
// [B, T, C] rows are {H, T * C, C / H, C}.
struct Layout {
  int64_t inner = 1;
  int64_t outer_stride = 0, inner_stride = 0, row_stride = 0;

  static Layout contiguous(int64_t rows, int64_t cols) { return {1, rows * cols, 0, cols}; }
  int64_t at(int64_t b, int64_t row) const {
    return (b / inner) * outer_stride + (b % inner) * inner_stride + row * row_stride;
  }
};

// The mask, read in place: element (head b, query i, key j) sits at
// at[b] + i * row_stride + j * col_stride (strides 0 where it broadcasts).
// At most one of keep and bias is set.
template <class T>
struct Mask {
  const bool* keep = nullptr;  // true = may attend
  const T* bias = nullptr;     // added to the scaled scores
  const int64_t* at = nullptr;  // [bh]
  int64_t row_stride = 0, col_stride = 0;
};

// Weight (b, i, j) is kept when the Philox draw of `seed` at position
// base + (b * l + i) * s + j is below `threshold`, then scaled by `scale`.
struct Dropout {
  bool on = false;
  uint64_t seed = 0, base = 0;
  uint64_t threshold = 0;
  double scale = 1.0;
};

// q, k, v, their gradients and the row statistics are contiguous; out and
// grad_out have out_at.
template <class T>
struct Problem {
  Dims dims;
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  Layout out_at;
  T scale = 1;  // of the scores q . k
  bool causal = false;
  Mask<T> mask;
  Dropout dropout;
};

// What forward keeps of each row's softmax for backward, each [bh, l]: the
// largest score m and 1 / l, l = sum exp(score - m) (scores included); m =
// +inf and 1 / l = 1 for a row whose keys are all masked (its output is 0).
template <class T>
struct Rows {
  T* max = nullptr;
  T* inv_sum = nullptr;
};

// out [bh, l, ev] and the rows' statistics.
template <class T>
void forward(const Problem<T>& p, T* out, Rows<T> rows);

// Gradients are added into grad_q/grad_k/grad_v (zeroed by the caller); each
// may be null when not wanted.
template <class T>
void backward(const Problem<T>& p, const T* out, Rows<const T> rows, const T* grad_out,
              T* grad_q, T* grad_k, T* grad_v);

}  // namespace lockstep::runtime::attention_kernels
