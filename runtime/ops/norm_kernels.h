// CPU kernels behind batch_norm and layer_norm: per-channel / per-row sums
// and the fused affine passes. Raw pointers over contiguous data; norm.cpp
// does the checking and the autograd wiring.
//
// Statistics are accumulated in double (in short float runs for f32, so the
// inner loops still vectorise) around a shift, the first value of the channel:
// sum((x - k)^2) does not cancel catastrophically when |mean| >> std, the
// weakness of the textbook one-pass E[x^2] - E[x]^2.
#pragma once

#include <cstdint>

namespace lockstep::runtime::norm_kernels {

// x viewed as [n, c, inner]; batch norm reduces over n and inner.
struct ChannelShape {
  int64_t n = 0, c = 0, inner = 0;
  int64_t count() const { return n * inner; }  // values per channel
};

// mean[c] and biased var[c] of each channel.
template <class T>
void channel_stats(const ChannelShape& s, const T* x, double* mean, double* var);

// The shift of y = x * scale + shift: b - mean * scale with the mean and the
// product rounded to T, as PyTorch's beta. x equal to the mean (a constant
// channel) then gives exactly 0 before the bias: a shift rounded from the
// double product left x * scale + shift at -0.03 for a constant 1000.
template <class T>
T affine_shift(double b, double mean, T scale) {
  return static_cast<T>(b) - static_cast<T>(mean) * scale;
}

// y = x * scale[c] + shift[c].
template <class T>
void channel_affine(const ChannelShape& s, const T* x, const T* scale, const T* shift, T* y);

// sum_gy[c] = sum(gy), sum_gy_xc[c] = sum(gy * (x - mean[c])).
template <class T>
void channel_grad_sums(const ChannelShape& s, const T* gy, const T* x, const double* mean,
                       double* sum_gy, double* sum_gy_xc);

// gx = gy * a[c] + x * b[c] + k[c] (the batch-statistics backward, folded).
template <class T>
void channel_grad_input(const ChannelShape& s, const T* gy, const T* x, const T* a, const T* b,
                        const T* k, T* gx);

// Layer norm over rows of length d: y = (x - mean) * invstd * w + b, with w, b
// optional (null); mean/invstd [rows] are written for backward.
template <class T>
void layer_norm_forward(int64_t rows, int64_t d, const T* x, const T* w, const T* b, double eps,
                        T* y, double* mean, double* invstd);

// grad_x (may be null) is overwritten; grad_w/grad_b (may be null) are overwritten.
template <class T>
void layer_norm_backward(int64_t rows, int64_t d, const T* gy, const T* x, const T* w,
                         const double* mean, const double* invstd, T* grad_x, T* grad_w,
                         T* grad_b);

}  // namespace lockstep::runtime::norm_kernels
