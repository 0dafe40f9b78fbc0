// Per-iteration timings of DistributedDataParallel, printable and as JSON.
//
// Communication is measured as the union of the buckets' [launch, completion]
// intervals, and its exposed part as what the end of backward still waited
// for; the rest ran while backward was computing. On a CUDA device whose
// collectives complete on the device (NCCL) the times are device times, read
// from events (device_clock); elsewhere they are host clocks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::nn {

struct DdpStats {
  int64_t iteration = 0;       // 1 for the first completed backward
  double forward_ms = 0;       // ddp.forward()
  double backward_ms = 0;      // end of forward to the end of backward's computation
  double comm_ms = 0;          // union of the buckets' communication intervals
  double exposed_comm_ms = 0;  // waited for after backward's computation ended
  // How many gradients were ready when the first bucket's all-reduce started,
  // out of how many this rank expected (evidence of overlap: fewer than all).
  int64_t ready_at_first_launch = 0;
  int64_t gradients_expected = 0;
  std::vector<int64_t> bucket_bytes;  // in launch order
  bool synced = true;                 // false under no_sync(): nothing communicated
  bool device_clock = false;          // the times come from CUDA events

  // The share of communication that overlapped backward, in [0, 1].
  double hidden_fraction() const;
  std::string str() const;
  std::string to_json() const;
};

// Total length of the union of [start, end] intervals: communication time
// when buckets' collectives overlap.
double union_length(std::vector<std::pair<double, double>> intervals);

}  // namespace lockstep::nn
