// RAII for the cuDNN descriptors the ops use: tensor, filter, convolution.
// Each is created in its constructor and destroyed in its destructor
// (errors there are ignored: destroying a descriptor cannot fail on a valid
// one). Move-less and copy-less: they live for one op call.
#pragma once

#include <cudnn.h>

#include "lockstep/runtime/cuda/cudnn_check.h"

namespace lockstep::runtime::cuda {

class TensorDescriptor {
 public:
  TensorDescriptor() { LOCKSTEP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_)); }
  // A packed NCHW tensor.
  TensorDescriptor(cudnnDataType_t type, int n, int c, int h, int w) : TensorDescriptor() {
    LOCKSTEP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, type, n, c, h, w));
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(d_); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDescriptor {
 public:
  // [k, c, h, w] in NCHW order.
  FilterDescriptor(cudnnDataType_t type, int k, int c, int h, int w) {
    LOCKSTEP_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_));
    LOCKSTEP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d_, type, CUDNN_TENSOR_NCHW, k, c, h, w));
  }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(d_); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor() { LOCKSTEP_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_)); }
  ~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

}  // namespace lockstep::runtime::cuda
