// A post-mortem of the collectives: what each rank was doing in its last
// collectives when a job failed, hung or was stopped, and its JSON form.
//
// lockstep-run builds one from its ranks' flight recorders
// (flight_recorder.h) and prints it (launcher/postmortem.h). A rank started
// by another launcher writes its own part when a collective of its fails
// (rank_postmortem.h), and `lockstep-run --postmortem-from DIR` merges the
// parts into the same report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/distributed/flight_recorder.h"

namespace lockstep::distributed {

struct PostmortemEntry {
  std::string group, op, dtype;
  // The group's ranks, and this rank's rank in it: which ranks of the job
  // are its members. 0 and -1: not known (a part of an older lockstep).
  int32_t group_size = 0;
  int32_t group_rank = -1;
  std::string state;  // "running", "finished", "failed"
  uint64_t seq = 0;   // 0: send or recv
  int64_t count = 0;
  int32_t root = -1;
  double started_s_ago = 0;
  std::optional<double> ended_s_ago;  // unset while running
};

struct RankHistory {
  int rank = 0;
  int node = 0;
  std::string host;
  int64_t pid = 0;
  // False: the rank left no record: it did not get as far as making its
  // process group (or, under another launcher, wrote no part).
  bool recorded = false;
  // Why it left no record where the report's general reason does not say it
  // (its node sent no part); "" otherwise.
  std::string no_record;
  std::vector<PostmortemEntry> entries;  // oldest first
  // Its newest call is unknown: its record was being written when read and
  // stayed so (the rank stopped or died mid-write). `entries` end before it.
  bool newest_torn = false;
  // Its process was stopped (SIGSTOP, a debugger) when its launcher read the
  // record: in a collective, the one the others wait for.
  bool stopped = false;
};

struct Postmortem {
  std::string cause;  // what stopped the job, as the launcher or the rank said it
  std::vector<RankHistory> ranks;  // by rank
  // When the ages were measured, in seconds since the epoch; 0: not said.
  // Parts written at different moments are brought to one moment by it.
  double written_unix_s = 0;
  int world_size = 0;  // 0: not said (a rank's own part says it)
  // Which launch, and which attempt of it, a rank's own part is of, e.g.
  // "torchrun run 7f3a, restart 1", "mpirun job 823656449"; "": not said.
  // A directory may keep parts of an earlier job or attempt, which the
  // report must not mix with the last's.
  std::string attempt;
};

// A rank's history from its flight records, with ages measured from now_ns
// (monotonic_ns()). Recorded even with no records: a rank makes its recorder
// with its first process group, so it got that far.
RankHistory rank_history(const std::vector<FlightRecord>& records, int64_t now_ns, int rank,
                         int node, const std::string& host, int64_t pid);

// The JSON form; indent < 0: one line.
std::string to_json_text(const Postmortem& postmortem, int indent = -1);
// Throws lockstep::Error saying what is malformed.
Postmortem postmortem_from_json_text(std::string_view text);

// Merges other's ranks into `into` (ranks sorted; a rank already there is
// kept).
void merge(Postmortem& into, const Postmortem& other);

}  // namespace lockstep::distributed
