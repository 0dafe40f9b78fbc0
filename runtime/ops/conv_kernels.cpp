// conv2d on the CPU as im2col + gemm.
//
// For one image and one group, a convolution is a matrix product:
//
//   y_g [cout_g, P] = w_g [cout_g, K] x col [K, P]
//
// with P = oh * ow output pixels and K = cin_g * kh * kw. Row (c, i, j) of the
// column matrix holds, for every output pixel, the input value under kernel
// tap (i, j) of channel c (zero in the padding). im2col builds it; the gemm
// (OpenBLAS) does all the arithmetic. The backward passes are the two other
// products of the same three matrices:
//
//   grad_w_g [cout_g, K] += grad_y_g [cout_g, P] x col^T [P, K]   (summed over images)
//   grad_col [K, P]       = w_g^T [K, cout_g] x grad_y_g [cout_g, P]
//
// and col2im scatters grad_col back onto the image (the adjoint of im2col).
//
// Batching: with many output pixels per image (P in the hundreds, the case
// of MNIST-sized images) one gemm per image is already large enough for the
// BLAS to run near peak, and its output lands directly in NCHW order. When P
// is small (late layers, 7x7 maps) the per-image products get thin, so
// `images_per_gemm` images are put side by side in one column matrix
// [K, b * P]; the product [cout_g, b * P] is then scattered into NCHW (and
// grad_y gathered the other way in backward). A 1x1, stride-1, unpadded conv
// skips im2col: the image itself is the column matrix.
//
// All workspaces come from per-thread grow-only scratch (cpu/scratch.h), so a
// training loop touches fresh pages only in its first step.
#include "lockstep/runtime/ops/conv_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lockstep/runtime/cpu/scratch.h"
#include "lockstep/runtime/cpu/simd.h"
#include "lockstep/runtime/ops/detail/gemm.h"

namespace lockstep::runtime::conv_kernels {
namespace {

using cpu::ScratchSlot;
using detail::gemm;

// Images per gemm: enough that the gemm's N dimension (b * P) is at least
// ~kMinColumns, so that thin per-image products are merged (measured on
// 64 -> 64 channels, 3x3: 7% faster at 7x7 maps, 20% at 4x4; no gain at 14x14).
int64_t images_per_gemm(const ConvShape& s) {
  constexpr int64_t kMinColumns = 256;
  const int64_t p = std::max<int64_t>(s.p(), 1);
  if (p >= kMinColumns) return 1;
  return std::clamp<int64_t>((kMinColumns + p - 1) / p, 1, std::max<int64_t>(s.n, 1));
}

// Output columns [lo, hi) whose input column ow * stride + offset is inside [0, width).
void valid_columns(int64_t offset, int64_t stride, int64_t width, int64_t out_width,
                   int64_t& lo, int64_t& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t end = width - offset;  // first invalid ow satisfies ow * stride >= end
  hi = end <= 0 ? 0 : (end + stride - 1) / stride;
  lo = std::min(lo, out_width);
  hi = std::clamp(hi, lo, out_width);
}

// dst[t] += src[t]. Written in blocks of 8 with non-aliasing pointers so that
// the compiler vectorises it at -O2 as well as at -O3.
template <class T>
void add_to(T* __restrict dst, const T* __restrict src, int64_t n) {
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int u = 0; u < 8; ++u) dst[t + u] += src[t + u];
  for (; t < n; ++t) dst[t] += src[t];
}

// Valid output ranges of every kernel row i ([h_lo, h_hi) of output rows) and
// column j ([w_lo, w_hi) of output columns). They do not depend on the
// channel, so they are computed once per image, not once per matrix row.
struct Taps {
  std::vector<int64_t> h_lo, h_hi, w_lo, w_hi;
  explicit Taps(const ConvShape& s) : h_lo(s.kh), h_hi(s.kh), w_lo(s.kw), w_hi(s.kw) {
    for (int64_t i = 0; i < s.kh; ++i)
      valid_columns(i * s.dh - s.ph, s.sh, s.h, s.oh, h_lo[i], h_hi[i]);
    for (int64_t j = 0; j < s.kw; ++j)
      valid_columns(j * s.dw - s.pw, s.sw, s.w, s.ow, w_lo[j], w_hi[j]);
  }
};

// Zeroes columns [0, lo) and [hi, ow) of output rows [oh_lo, oh_hi) of a
// column-matrix row. Written column by column (strided) on purpose: a
// per-row loop of one or two elements is turned into a memset call by the
// compiler, and those calls dominated im2col's run time.
template <class T>
void zero_border_columns(T* row, int64_t ow_n, int64_t oh_lo, int64_t oh_hi, int64_t lo,
                         int64_t hi) {
  for (int64_t q = 0; q < lo; ++q)
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) row[oh * ow_n + q] = T(0);
  for (int64_t q = hi; q < ow_n; ++q)
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) row[oh * ow_n + q] = T(0);
}

// Both transforms walk the column matrix one row (channel c, tap i, j) at a
// time. Within a row, output pixel (oh, ow) reads input (oh * sh + i * dh - ph,
// ow * sw + j * dw - pw); rows [oh_lo, oh_hi) and columns [lo, hi) are the
// ones that land inside the image.
//
// Fast path ("shifted copy"): with unit strides and ow == w (the usual "same"
// padding), consecutive output rows are consecutive input rows, so the whole
// valid block of a column-matrix row is ONE contiguous shifted copy of the
// image; only the few wrapped-around border columns are fixed up afterwards.
// This replaces oh short copies per row by one long one.
//
// kZeroed: the caller has zeroed col and only ever writes the same geometry
// into it, so the entries in the padding are already zero and only the
// valid ones (plus the wrapped columns of the shifted copy) are written. The
// conv loops zero their scratch once per call and then fill image after
// image this way.
template <bool kZeroed, class T>
void im2col_impl(const ConvShape& s, int64_t channels, const T* x, T* col, int64_t ld_col) {
  const int64_t ow_n = s.ow, p = s.oh * s.ow;
  const bool shifted_copy = s.sh == 1 && s.sw == 1 && s.ow == s.w;
  const Taps taps(s);
  for (int64_t c = 0; c < channels; ++c) {
    const T* xc = x + c * s.h * s.w;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t off_h = i * s.dh - s.ph;
      const int64_t oh_lo = taps.h_lo[i], oh_hi = taps.h_hi[i];
      for (int64_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * ld_col;
        const int64_t off_w = j * s.dw - s.pw;
        const int64_t lo = taps.w_lo[j], hi = taps.w_hi[j];
        if (!kZeroed) {
          std::fill(row, row + oh_lo * ow_n, T(0));
          std::fill(row + std::max(oh_hi, oh_lo) * ow_n, row + p, T(0));
        }
        if (oh_lo >= oh_hi) continue;
        if (shifted_copy && lo < hi) {
          // row[t] = xc[t + shift] for t from the first valid to the last valid element.
          const int64_t shift = off_h * s.w + off_w;
          const int64_t t0 = oh_lo * ow_n + lo, t1 = (oh_hi - 1) * ow_n + hi;
          std::copy(xc + t0 + shift, xc + t1 + shift, row + t0);
          zero_border_columns(row, ow_n, oh_lo, oh_hi, lo, hi);
          continue;
        }
        if (!kZeroed) zero_border_columns(row, ow_n, oh_lo, oh_hi, lo, hi);
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* dst = row + oh * ow_n;
          const T* src = xc + (oh * s.sh + off_h) * s.w;
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * s.sw + off_w];
        }
      }
    }
  }
}

// The column-matrix scratch of one conv call: zeroed when first used with a
// layout, then refilled image after image with im2col_impl<true>.
template <class T>
class Columns {
 public:
  explicit Columns(cpu::ScratchSlot slot) : slot_(slot) {}
  T* get(int64_t rows, int64_t cols) {
    if (cols != cols_) {
      data_ = cpu::scratch<T>(slot_, static_cast<size_t>(rows * cols));
      std::fill(data_, data_ + rows * cols, T(0));
      cols_ = cols;
    }
    return data_;
  }

 private:
  cpu::ScratchSlot slot_;
  T* data_ = nullptr;
  int64_t cols_ = -1;
};

}  // namespace

template <class T>
void im2col(const ConvShape& s, int64_t channels, const T* x, T* col, int64_t ld_col) {
  im2col_impl<false>(s, channels, x, col, ld_col);
}

template <class T>
void col2im_add(const ConvShape& s, int64_t channels, T* col, int64_t ld_col, T* x) {
  const int64_t ow_n = s.ow;
  const bool shifted_copy = s.sh == 1 && s.sw == 1 && s.ow == s.w;
  const Taps taps(s);
  for (int64_t c = 0; c < channels; ++c) {
    T* xc = x + c * s.h * s.w;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t off_h = i * s.dh - s.ph;
      const int64_t oh_lo = taps.h_lo[i], oh_hi = taps.h_hi[i];
      if (oh_lo >= oh_hi) continue;
      for (int64_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * ld_col;
        const int64_t off_w = j * s.dw - s.pw;
        const int64_t lo = taps.w_lo[j], hi = taps.w_hi[j];
        if (lo >= hi) continue;
        if (shifted_copy) {
          // Zero the wrapped-around border entries (they belong to no input
          // pixel in this row), then add the block in one contiguous pass.
          zero_border_columns(row, ow_n, oh_lo, oh_hi, lo, hi);
          const int64_t shift = off_h * s.w + off_w;
          const int64_t t0 = oh_lo * ow_n + lo, t1 = (oh_hi - 1) * ow_n + hi;
          add_to(xc + t0 + shift, row + t0, t1 - t0);
          continue;
        }
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const T* src = row + oh * ow_n;
          T* dst = xc + (oh * s.sh + off_h) * s.w;
          if (s.sw == 1) {
            add_to(dst + lo + off_w, src + lo, hi - lo);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow * s.sw + off_w] += src[ow];
          }
        }
      }
    }
  }
}

template <class T>
void conv2d_forward(const ConvShape& s, const T* x, const T* weight, const T* bias, T* y) {
  const int64_t k = s.k(), p = s.p(), cout_g = s.cout_g(), cin_g = s.cin_g();
  const int64_t image_in = s.c_in * s.h * s.w, image_out = s.c_out * p;
  const int64_t group_in = cin_g * s.h * s.w;
  const int64_t per_gemm = images_per_gemm(s);
  Columns<T> columns(ScratchSlot::kA);
  for (int64_t n0 = 0; n0 < s.n; n0 += per_gemm) {
    const int64_t b = std::min(per_gemm, s.n - n0);
    const int64_t cols = b * p;
    for (int64_t g = 0; g < s.groups; ++g) {
      const T* w_g = weight + g * cout_g * k;
      if (b == 1) {
        // Straight into y: the product's rows are this image's output channels.
        const T* x_g = x + n0 * image_in + g * group_in;
        const T* col = x_g;
        if (!s.pointwise()) {
          T* buf = columns.get(k, p);
          im2col_impl<true>(s, cin_g, x_g, buf, p);
          col = buf;
        }
        T* y_g = y + n0 * image_out + g * cout_g * p;
        if (bias != nullptr) {
          for (int64_t co = 0; co < cout_g; ++co)
            std::fill(y_g + co * p, y_g + (co + 1) * p, bias[g * cout_g + co]);
        }
        gemm(false, false, cout_g, p, k, T(1), w_g, k, col, p,
                  bias != nullptr ? T(1) : T(0), y_g, p);
        continue;
      }
      T* col = columns.get(k, cols);
      for (int64_t i = 0; i < b; ++i) {
        const T* x_g = x + (n0 + i) * image_in + g * group_in;
        if (s.pointwise()) {
          for (int64_t r = 0; r < k; ++r)
            std::memcpy(col + r * cols + i * p, x_g + r * p, sizeof(T) * p);
        } else {
          im2col_impl<true>(s, cin_g, x_g, col + i * p, cols);
        }
      }
      T* prod = cpu::scratch<T>(ScratchSlot::kB, static_cast<size_t>(cout_g * cols));
      gemm(false, false, cout_g, cols, k, T(1), w_g, k, col, cols, T(0), prod, cols);
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t co = 0; co < cout_g; ++co) {
          const T* src = prod + co * cols + i * p;
          T* dst = y + (n0 + i) * image_out + (g * cout_g + co) * p;
          const T add = bias != nullptr ? bias[g * cout_g + co] : T(0);
          for (int64_t q = 0; q < p; ++q) dst[q] = src[q] + add;
        }
      }
    }
  }
}

template <class T>
void conv2d_backward(const ConvShape& s, const T* x, const T* weight, const T* grad_y,
                     T* grad_x, T* grad_w, T* grad_b) {
  const int64_t k = s.k(), p = s.p(), cout_g = s.cout_g(), cin_g = s.cin_g();
  const int64_t image_in = s.c_in * s.h * s.w, image_out = s.c_out * p;
  const int64_t group_in = cin_g * s.h * s.w;
  const int64_t per_gemm = images_per_gemm(s);

  if (grad_b != nullptr) {
    // Each (image, channel) row is summed in T with vector lanes, the rows in
    // double: a batch sum of many rows would otherwise lose f32 precision.
    constexpr int L = cpu::kLanes<T>;
    for (int64_t co = 0; co < s.c_out; ++co) {
      double total = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const T* row = grad_y + n * image_out + co * p;
        cpu::vec_t<T> a0 = {}, a1 = {};
        int64_t q = 0;
        for (; q + 2 * L <= p; q += 2 * L) a0 += cpu::load(row + q), a1 += cpu::load(row + q + L);
        total += cpu::lane_sum<T>(a0 + a1);
        for (; q < p; ++q) total += row[q];
      }
      grad_b[co] = static_cast<T>(total);
    }
  }
  if (grad_x == nullptr && grad_w == nullptr) return;
  Columns<T> columns(ScratchSlot::kA);

  for (int64_t n0 = 0; n0 < s.n; n0 += per_gemm) {
    const int64_t b = std::min(per_gemm, s.n - n0);
    const int64_t cols = b * p;
    for (int64_t g = 0; g < s.groups; ++g) {
      const T* w_g = weight + g * cout_g * k;
      // grad_y for this group as [cout_g, cols]: in place for one image,
      // gathered for several.
      const T* gy = grad_y + n0 * image_out + g * cout_g * p;
      if (b > 1) {
        T* buf = cpu::scratch<T>(ScratchSlot::kC, static_cast<size_t>(cout_g * cols));
        for (int64_t co = 0; co < cout_g; ++co)
          for (int64_t i = 0; i < b; ++i)
            std::memcpy(buf + co * cols + i * p,
                        grad_y + (n0 + i) * image_out + (g * cout_g + co) * p, sizeof(T) * p);
        gy = buf;
      }
      if (grad_w != nullptr) {
        const T* col = x + n0 * image_in + g * group_in;
        if (b > 1 || !s.pointwise()) {
          T* buf = columns.get(k, cols);
          for (int64_t i = 0; i < b; ++i) {
            const T* x_g = x + (n0 + i) * image_in + g * group_in;
            if (s.pointwise()) {
              for (int64_t r = 0; r < k; ++r)
                std::memcpy(buf + r * cols + i * p, x_g + r * p, sizeof(T) * p);
            } else {
              im2col_impl<true>(s, cin_g, x_g, buf + i * p, cols);
            }
          }
          col = buf;
        }
        gemm(false, true, cout_g, k, cols, T(1), gy, cols, col, cols,
                  n0 == 0 ? T(0) : T(1), grad_w + g * cout_g * k, k);
      }
      if (grad_x != nullptr) {
        if (b == 1 && s.pointwise()) {
          gemm(true, false, k, p, cout_g, T(1), w_g, k, gy, p, T(0),
                    grad_x + n0 * image_in + g * group_in, p);
          continue;
        }
        T* gcol = cpu::scratch<T>(ScratchSlot::kB, static_cast<size_t>(k * cols));
        gemm(true, false, k, cols, cout_g, T(1), w_g, k, gy, cols, T(0), gcol, cols);
        for (int64_t i = 0; i < b; ++i) {
          T* gx_g = grad_x + (n0 + i) * image_in + g * group_in;
          std::fill(gx_g, gx_g + group_in, T(0));
          col2im_add(s, cin_g, gcol + i * p, cols, gx_g);
        }
      }
    }
  }
  if (grad_w != nullptr && s.n == 0) std::fill(grad_w, grad_w + s.c_out * k, T(0));
}

#define LOCKSTEP_INSTANTIATE(T)                                                              \
  template void im2col<T>(const ConvShape&, int64_t, const T*, T*, int64_t);                 \
  template void col2im_add<T>(const ConvShape&, int64_t, T*, int64_t, T*);                       \
  template void conv2d_forward<T>(const ConvShape&, const T*, const T*, const T*, T*);       \
  template void conv2d_backward<T>(const ConvShape&, const T*, const T*, const T*, T*, T*, \
                                   T*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::runtime::conv_kernels
