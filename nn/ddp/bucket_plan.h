// Which parameters share a bucket, as PyTorch's compute_bucket_assignment_by_size.
//
// Parameters are taken in the order their gradients are expected to become
// ready (reverse registration order at first: backward reaches the last
// layers first; rank 0's observed order after the first iteration). Each
// dtype and device has its own buckets; a bucket closes once it holds at
// least its cap, the first cap (small, so the first all-reduce starts early)
// and then the regular one. Buckets are ordered by their earliest parameter,
// which is the order every rank launches them in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

struct BucketParam {
  int64_t bytes = 0;
  runtime::DType dtype = runtime::DType::f32;
  runtime::Device device = runtime::Device::cpu();
};

// `order` is a permutation of 0..params.size()-1. Returns, per bucket, the
// parameter indices it holds, in `order`'s order.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                const std::vector<size_t>& order,
                                                int64_t first_cap_bytes, int64_t cap_bytes);

// 0..n-1 reversed: the expected ready order before any backward was seen.
std::vector<size_t> reverse_order(size_t n);

}  // namespace lockstep::nn
