// CPU kernels behind max_pool2d, avg_pool2d and adaptive_avg_pool2d. Raw
// pointers over contiguous [planes, h, w] data (planes = N * C); pool.cpp does
// the checking and the autograd wiring.
#pragma once

#include <cstdint>

namespace lockstep::runtime::pool_kernels {

struct PoolShape {
  int64_t planes = 0, h = 0, w = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  int64_t oh = 0, ow = 0;
};

// y = window maxima; argmax = flat index (ih * w + iw) of each maximum in its
// plane, which backward scatters to. NaN wins, as in PyTorch.
template <class T>
void max_pool_forward(const PoolShape& s, const T* x, T* y, int32_t* argmax);
// grad_x is overwritten.
template <class T>
void max_pool_backward(const PoolShape& s, const T* grad_y, const int32_t* argmax, T* grad_x);

// Average over each window, divided by the window's size including padding
// (count_include_pad = true).
template <class T>
void avg_pool_forward(const PoolShape& s, const T* x, T* y);
template <class T>
void avg_pool_backward(const PoolShape& s, const T* grad_y, T* grad_x);

// Output cell (i, j) averages input rows [floor(i*h/oh), ceil((i+1)*h/oh)) and
// the columns likewise (PyTorch's formula). Only h, w, oh, ow, planes are used.
template <class T>
void adaptive_avg_pool_forward(const PoolShape& s, const T* x, T* y);
template <class T>
void adaptive_avg_pool_backward(const PoolShape& s, const T* grad_y, T* grad_x);

}  // namespace lockstep::runtime::pool_kernels
