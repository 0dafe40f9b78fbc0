#include "lockstep/nn/ddp/ddp_stats.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace lockstep::nn {

double union_length(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0;
  for (size_t i = 0; i < intervals.size();) {
    auto [start, end] = intervals[i];
    for (++i; i < intervals.size() && intervals[i].first <= end; ++i)
      end = std::max(end, intervals[i].second);
    total += end - start;
  }
  return total;
}

double DdpStats::hidden_fraction() const {
  if (comm_ms <= 0) return 0.0;
  return std::clamp(1.0 - exposed_comm_ms / comm_ms, 0.0, 1.0);
}

std::string DdpStats::str() const {
  const int64_t total = std::accumulate(bucket_bytes.begin(), bucket_bytes.end(), int64_t{0});
  return fmt::format(
      "iteration {}: forward {:.3f} ms, backward {:.3f} ms, communication {:.3f} ms ({:.3f} ms "
      "exposed, {:.0f}% hidden), first bucket launched with {}/{} gradients ready, {} buckets "
      "({} bytes){}{}",
      iteration, forward_ms, backward_ms, comm_ms, exposed_comm_ms, 100.0 * hidden_fraction(),
      ready_at_first_launch, gradients_expected, bucket_bytes.size(), total,
      synced ? "" : ", no_sync: nothing communicated", device_clock ? ", device times" : "");
}

std::string DdpStats::to_json() const {
  return fmt::format(
      "{{\"iteration\": {}, \"forward_ms\": {:.6f}, \"backward_ms\": {:.6f}, \"comm_ms\": {:.6f}, "
      "\"exposed_comm_ms\": {:.6f}, \"hidden_fraction\": {:.6f}, \"ready_at_first_launch\": {}, "
      "\"gradients_expected\": {}, \"bucket_bytes\": [{}], \"synced\": {}, \"device_clock\": {}}}",
      iteration, forward_ms, backward_ms, comm_ms, exposed_comm_ms, hidden_fraction(),
      ready_at_first_launch, gradients_expected, fmt::join(bucket_bytes, ", "),
      synced ? "true" : "false", device_clock ? "true" : "false");
}

}  // namespace lockstep::nn
