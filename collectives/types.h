// Reduction operators and the options aggregate of every collective.
//
// Each collective takes its options by const reference with defaults, so a
// call reads `group.allreduce(t, {.op = ReduceOp::Avg})`. A timeout left
// unset uses the group's (ProcessGroup::timeout(), 10 minutes by default).
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace lockstep::collectives {

// Avg is Sum divided by the group size; for integer dtypes the division
// truncates toward zero (as NCCL's ncclAvg does). On the CPU backends bf16
// and f16 average in float, rounding the mean once (float_average.h).
enum class ReduceOp { Sum, Avg, Min, Max, Product };

std::string_view to_string(ReduceOp op);

using Timeout = std::optional<std::chrono::milliseconds>;

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Timeout timeout;
};

struct BroadcastOptions {
  int root = 0;
  Timeout timeout;
};

struct ReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  Timeout timeout;
};

struct AllgatherOptions {
  Timeout timeout;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  Timeout timeout;
};

struct BarrierOptions {
  Timeout timeout;
};

struct SendRecvOptions {
  int tag = 0;
  Timeout timeout;
};

}  // namespace lockstep::collectives
