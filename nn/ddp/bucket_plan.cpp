#include "lockstep/nn/ddp/bucket_plan.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "lockstep/runtime/error.h"

namespace lockstep::nn {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                const std::vector<size_t>& order,
                                                int64_t first_cap_bytes, int64_t cap_bytes) {
  LOCKSTEP_CHECK(order.size() == params.size(),
                 "assign_buckets: the order lists {} parameters, there are {}", order.size(),
                 params.size());
  LOCKSTEP_CHECK(first_cap_bytes > 0 && cap_bytes > 0,
                 "bucket caps must be positive (got first {} bytes, then {} bytes); set "
                 "DdpOptions::first_bucket_cap_mb and bucket_cap_mb above 0",
                 first_cap_bytes, cap_bytes);
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
    bool first = true;  // the next bucket closed for this key is its first
  };
  std::map<std::pair<int, std::string>, Open> open;  // per (dtype, device)
  std::vector<std::vector<size_t>> buckets;
  std::vector<bool> seen(params.size(), false);
  for (size_t index : order) {
    LOCKSTEP_CHECK(index < params.size() && !seen[index],
                   "assign_buckets: the order is not a permutation (index {} of {})", index,
                   params.size());
    seen[index] = true;
    const BucketParam& p = params[index];
    Open& bucket = open[{static_cast<int>(p.dtype), p.device.str()}];
    bucket.members.push_back(index);
    bucket.bytes += p.bytes;
    if (bucket.bytes >= (bucket.first ? first_cap_bytes : cap_bytes)) {
      buckets.push_back(std::move(bucket.members));
      bucket = Open{.first = false};
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.members.empty()) buckets.push_back(std::move(bucket.members));
  }
  // Launch order: by position of the bucket's first parameter in `order`.
  std::vector<size_t> position(params.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::stable_sort(buckets.begin(), buckets.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return buckets;
}

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

}  // namespace lockstep::nn
