// CPU kernels behind conv2d: im2col/col2im and the gemm-based forward and
// backward passes. Raw pointers, contiguous NCHW, no autograd; conv.cpp does
// the checking and the wiring.
#pragma once

#include <cstdint>

namespace lockstep::runtime::conv_kernels {

// Geometry of one conv2d call. Weight is [c_out, c_in / groups, kh, kw].
struct ConvShape {
  int64_t n = 0, c_in = 0, h = 0, w = 0;
  int64_t c_out = 0, kh = 0, kw = 0;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t groups = 1;
  int64_t oh = 0, ow = 0;

  int64_t cin_g() const { return c_in / groups; }
  int64_t cout_g() const { return c_out / groups; }
  int64_t k() const { return cin_g() * kh * kw; }  // rows of the column matrix
  int64_t p() const { return oh * ow; }           // output pixels per image
  // A 1x1, stride-1, unpadded conv reads the image itself as its column matrix.
  bool pointwise() const {
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
  }
};

// y [n, c_out, oh, ow] = conv(x, weight) + bias (bias may be null).
template <class T>
void conv2d_forward(const ConvShape& s, const T* x, const T* weight, const T* bias, T* y);

// Any of grad_x, grad_w, grad_b may be null (not wanted); the others are
// overwritten. x is needed only for grad_w, weight only for grad_x.
template <class T>
void conv2d_backward(const ConvShape& s, const T* x, const T* weight, const T* grad_y,
                     T* grad_x, T* grad_w, T* grad_b);

// Exposed for tests and benchmarks. One image's channels [c, h, w] -> the
// column matrix [c * kh * kw, oh * ow] with row stride ld_col (zero where the
// window falls in the padding). col2im_add adds the columns back onto x (the
// adjoint of im2col); it may overwrite the entries of col that fall in the
// padding (they are scratch by then).
template <class T>
void im2col(const ConvShape& s, int64_t channels, const T* x, T* col, int64_t ld_col);
template <class T>
void col2im_add(const ConvShape& s, int64_t channels, T* col, int64_t ld_col, T* x);

}  // namespace lockstep::runtime::conv_kernels
