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

#include <cblas.h>

#include "lockstep/runtime/cpu/scratch.h"

namespace lockstep::runtime::conv_kernels {
#ifdef LOCKSTEP_CONV_BENCH
int64_t images_per_gemm_override = 0;  // set by a benchmark to compare batchings
#endif

namespace {

using cpu::ScratchSlot;

// Row-major C = alpha * op(A) op(B) + beta * C on OpenBLAS; op(A) [m, k],
// op(B) [k, n]; lda/ldb/ldc are row strides.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}


// Images per gemm: enough that the gemm's N dimension (b * P) is at least
// ~kMinColumns, so that thin per-image products are merged.
int64_t images_per_gemm(const ConvShape& s) {
#ifdef LOCKSTEP_CONV_BENCH
  if (images_per_gemm_override > 0) return std::min(images_per_gemm_override, s.n);
#endif
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

}  // namespace

// Both transforms walk the column matrix one row (channel c, tap i, j) at a
// time. Within a row, output pixel (oh, ow) reads input (oh * sh + i * dh - ph,
// ow * sw + j * dw - pw); rows [oh_lo, oh_hi) and columns [ow_lo, ow_hi) are
// the ones that land inside the image.
//
// Fast path ("shifted copy"): with unit strides and ow == w (the usual "same"
// padding), consecutive output rows are consecutive input rows, so the whole
// valid block of a column-matrix row is ONE contiguous shifted copy of the
// image; only the few wrapped-around border columns are fixed up afterwards.
// This replaces oh short copies per row by one long one.
template <class T>
void im2col(const ConvShape& s, int64_t channels, const T* x, T* col, int64_t ld_col) {
  const int64_t ow_n = s.ow, p = s.oh * s.ow;
  const bool shifted_copy = s.sh == 1 && s.sw == 1 && s.ow == s.w;
  for (int64_t c = 0; c < channels; ++c) {
    const T* xc = x + c * s.h * s.w;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t off_h = i * s.dh - s.ph;
      int64_t oh_lo, oh_hi;
      valid_columns(off_h, s.sh, s.h, s.oh, oh_lo, oh_hi);
      for (int64_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * ld_col;
        const int64_t off_w = j * s.dw - s.pw;
        int64_t lo, hi;
        valid_columns(off_w, s.sw, s.w, ow_n, lo, hi);
        std::fill(row, row + oh_lo * ow_n, T(0));
        std::fill(row + oh_hi * ow_n, row + p, T(0));
        if (oh_lo >= oh_hi) continue;
        if (shifted_copy && lo < hi) {
          // row[t] = xc[t + shift] for t from the first valid to the last valid element.
          const int64_t shift = off_h * s.w + off_w;
          const int64_t t0 = oh_lo * ow_n + lo, t1 = (oh_hi - 1) * ow_n + hi;
          std::copy(xc + t0 + shift, xc + t1 + shift, row + t0);
          if (lo > 0 || hi < ow_n) {
            for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
              T* dst = row + oh * ow_n;
              for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = T(0);
              for (int64_t ow = hi; ow < ow_n; ++ow) dst[ow] = T(0);
            }
          }
          continue;
        }
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* dst = row + oh * ow_n;
          const T* src = xc + (oh * s.sh + off_h) * s.w;
          for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = T(0);
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * s.sw + off_w];
          for (int64_t ow = hi; ow < ow_n; ++ow) dst[ow] = T(0);
        }
      }
    }
  }
}

template <class T>
void col2im_add(const ConvShape& s, int64_t channels, T* col, int64_t ld_col, T* x) {
  const int64_t ow_n = s.ow;
  const bool shifted_copy = s.sh == 1 && s.sw == 1 && s.ow == s.w;
  for (int64_t c = 0; c < channels; ++c) {
    T* xc = x + c * s.h * s.w;
    for (int64_t i = 0; i < s.kh; ++i) {
      const int64_t off_h = i * s.dh - s.ph;
      int64_t oh_lo, oh_hi;
      valid_columns(off_h, s.sh, s.h, s.oh, oh_lo, oh_hi);
      if (oh_lo >= oh_hi) continue;
      for (int64_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * ld_col;
        const int64_t off_w = j * s.dw - s.pw;
        int64_t lo, hi;
        valid_columns(off_w, s.sw, s.w, ow_n, lo, hi);
        if (lo >= hi) continue;
        if (shifted_copy) {
          // Zero the wrapped-around border entries (they belong to no input
          // pixel in this row), then add the block in one contiguous pass.
          for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
            T* r = row + oh * ow_n;
            for (int64_t ow = 0; ow < lo; ++ow) r[ow] = T(0);
            for (int64_t ow = hi; ow < ow_n; ++ow) r[ow] = T(0);
          }
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
          T* buf = cpu::scratch<T>(ScratchSlot::kA, static_cast<size_t>(k * p));
          im2col(s, cin_g, x_g, buf, p);
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
      T* col = cpu::scratch<T>(ScratchSlot::kA, static_cast<size_t>(k * cols));
      for (int64_t i = 0; i < b; ++i) {
        const T* x_g = x + (n0 + i) * image_in + g * group_in;
        if (s.pointwise()) {
          for (int64_t r = 0; r < k; ++r)
            std::memcpy(col + r * cols + i * p, x_g + r * p, sizeof(T) * p);
        } else {
          im2col(s, cin_g, x_g, col + i * p, cols);
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
    // Summed in double per (image, channel) row: the rows are long and the
    // batch sum of many rows would otherwise lose f32 precision.
    for (int64_t co = 0; co < s.c_out; ++co) {
      double total = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const T* row = grad_y + n * image_out + co * p;
        T acc[8] = {};
        int64_t q = 0;
        for (; q + 8 <= p; q += 8)
          for (int u = 0; u < 8; ++u) acc[u] += row[q + u];
        for (; q < p; ++q) acc[0] += row[q];
        for (int u = 0; u < 8; ++u) total += acc[u];
      }
      grad_b[co] = static_cast<T>(total);
    }
  }
  if (grad_x == nullptr && grad_w == nullptr) return;

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
          T* buf = cpu::scratch<T>(ScratchSlot::kA, static_cast<size_t>(k * cols));
          for (int64_t i = 0; i < b; ++i) {
            const T* x_g = x + (n0 + i) * image_in + g * group_in;
            if (s.pointwise()) {
              for (int64_t r = 0; r < k; ++r)
                std::memcpy(buf + r * cols + i * p, x_g + r * p, sizeof(T) * p);
            } else {
              im2col(s, cin_g, x_g, buf + i * p, cols);
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
