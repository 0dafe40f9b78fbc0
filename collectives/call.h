// One collective as the front of a ProcessGroup hands it to its backend: what
// every rank must agree on (the signature), and how the call is named and
// bounded in errors.
//
// The signature travels with each call: every backend checks, as part of
// moving the data, that all ranks issued the same one, and fails every rank
// at once when they did not (collective_error.h words it). It is 32 bytes on
// the wire (pack/unpack), so it rides in shared memory or one small message.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives {

// How long a rank that destroyed its group still counts as ending: its
// process usually exits meanwhile, and the launcher should learn of that exit
// (and its code) before the other ranks fail because of it (shm's wait, the
// desync checker).
inline constexpr std::chrono::seconds kLeftGroupGrace{2};

enum class CollectiveKind : uint8_t {
  allreduce,
  broadcast,
  reduce,
  allgather,
  reduce_scatter,
  barrier
};

std::string_view to_string(CollectiveKind kind);

struct CallSignature {
  uint64_t seq = 0;  // the call's number in its group's sequence, from 1
  CollectiveKind kind = CollectiveKind::barrier;
  runtime::DType dtype = runtime::DType::f32;  // unused by a barrier
  int64_t count = 0;            // elements: allgather's input, reduce_scatter's output
  int32_t root = -1;            // broadcast and reduce; -1 otherwise
  ReduceOp op = ReduceOp::Sum;  // allreduce, reduce, reduce_scatter
  // A composite group's member call made for one of the composite's calls
  // (hierarchical_group.h) is checked as that call plus the step it serves.
  uint8_t step = 0;
  int32_t rank = -1;  // the caller, in the group the signature names: not compared

  // Every field but `rank` is equal.
  bool same_call(const CallSignature& other) const;
  // "allreduce(f32, 1000 elements, sum)", "broadcast(i64, 2 elements, root 1)",
  // "barrier()".
  std::string text() const;
};

// Part of the wire protocol: change distributed/wire_protocol.h's
// kWireProtocol with this packing.
using PackedSignature = std::array<uint64_t, 4>;
PackedSignature pack(const CallSignature& signature);
CallSignature unpack(const PackedSignature& words);
// A hash of what same_call() compares: equal calls hash alike, so a rank
// compares 8 bytes with each peer and reads the full signatures only when a
// hash differs.
uint64_t call_hash(const CallSignature& signature);

// What a backend gets for one call, numbered and validated.
struct Call {
  // What every rank must agree on: for a composite group's member call, the
  // composite's call (ProcessGroup::check_next_as).
  CallSignature signature;
  // This group's own call (seq 0 for send and recv), which description() names.
  CallSignature own;
  std::string_view op;     // "allreduce", "send", ...: a string literal
  bool has_tensor = true;  // false: a barrier, or a backend's call of several tensors
  // What follows the dtype and count where the signature does not say it:
  // "to rank 1, tag 0".
  std::string extra;
  // "group 'default' (shm, 4 ranks)": the group whose calls the signature
  // numbers (a composite's for its members' calls). Shared: made once.
  std::shared_ptr<const std::string> group;
  // For a composite's member call: the composite's rank of each rank of the
  // member group, so that errors name the ranks the caller knows; null
  // otherwise.
  std::shared_ptr<const std::vector<int>> ranks;
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;
  // A wait for other ranks that lasts this long prints one line saying what
  // it waits for and on whom (ProcessGroup::report_stalls_after).
  std::chrono::milliseconds stall_report{std::chrono::minutes(1)};

  // "allreduce #12 (f32, 1000 elements, sum)", "send (f32, 10 elements, to
  // rank 1, tag 0)": names the call in errors. Made when asked for: most
  // calls never need it.
  std::string description() const;
  // "rank 1" for rank 1 of the group that runs the call; for a member call,
  // the composite's rank: "rank 3 of group 'default' (shm+gloo, 4 ranks)".
  std::string rank_name(int rank) const;
};

// "collective #943 differs across the ranks of group 'default' (shm, 2
// ranks): rank 0 called allreduce(i64, 2 elements, sum); rank 1 called
// allreduce(f32, 1059850 elements, sum). ..." from every rank's signature
// (by rank; ranks with the same call are named together).
std::string mismatch_message(const Call& call, const std::vector<CallSignature>& every_rank);

// "rank 1", "ranks 0 and 2", "ranks 0, 1 and 3".
std::string ranks_text(const std::vector<int>& ranks);

// "<description> timed out after 600 s on <where>: <detail>; raise the
// timeout ...", `where` naming this rank ("rank 1 of group 'default' (shm, 4
// ranks)"). An empty `detail` says that some rank did not join in time.
std::string timeout_message(const Call& call, std::string_view where, std::string_view detail);

// The one line a long wait prints: "lockstep: <where>: <description> has
// waited 60 s for other ranks: <detail>; it waits 540 s more before it gives
// up".
std::string stall_message(const Call& call, std::string_view where,
                          std::chrono::steady_clock::duration waited, std::string_view detail);

}  // namespace lockstep::collectives
