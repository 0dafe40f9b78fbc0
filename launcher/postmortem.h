// The post-mortem: when a job fails, hangs or is stopped, what every rank was
// doing in its collectives, in one report.
//
// Each rank records its last collectives in a file of this node's private
// directory (LOCKSTEP_FLIGHT_RECORDER, distributed/flight_recorder.h). At the
// first failure, before the ranks are stopped, the launcher reads every
// file (a stopped or dead rank's too) into a Postmortem; after the ranks
// have stopped it prints the report and writes it as JSON:
//
//   lockstep-run: post-mortem of the collectives (rank 1 ... is hung: ...):
//     group 'default': rank 1 is behind: ranks 0 and 2 are in allreduce #1235
//       rank 1: finished allreduce #1234 (f32, 1000 elements) 12.0 s ago; nothing since
//       ranks 0 and 2: in allreduce #1235 (f32, 1000 elements) since 12.0 s
//     every rank's last 256 collectives: ./lockstep-postmortem-<job>-node0-attempt0.json
//
// Several nodes: every node's launcher publishes its ranks' part through the
// store and node 0's report covers the nodes that answered, and names the
// ranks of those that did not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/distributed/postmortem.h"

namespace lockstep::launcher {

using distributed::Postmortem;
using distributed::PostmortemEntry;
using distributed::RankHistory;

// Reads one rank's recorder file, with ages measured from now. A file that
// cannot be read gives an unrecorded history (and a note on stderr); no
// file (`path` empty: the launcher had nowhere to keep them), one that says so.
RankHistory read_rank_history(const std::string& path, int rank, int node,
                              const std::string& host, int64_t pid);

// "rank 1", "ranks 0 and 2", "ranks 0-3, 6 and 8".
std::string ranks_text(std::vector<int> ranks);

// The report's lines after its title, or "" when no rank issued a
// collective. `no_record` says why a rank may have left no record
// (postmortem_report.cpp).
std::string report_text(const Postmortem& postmortem,
                        std::string_view no_record = "it did not get as far as making its "
                                                     "process group");

// The parts that ranks under another launcher wrote to `dir`
// (distributed/rank_postmortem.h), merged, their ages brought to the moment
// the last was written; a rank of the job that wrote none is unrecorded.
// Parts of another job or attempt than the last part's (torchrun or Slurm
// restarted the ranks, an earlier mpirun job wrote there) or of a job of
// another size are left out, and said so on stderr.
// A part that cannot be read is said on stderr, and its rank left no record.
// Throws lockstep::Error when `dir` holds no part that can be read.
Postmortem read_rank_postmortems(const std::string& dir);

// Prints the report on stderr and writes the JSON to
// `dir`/lockstep-postmortem-<job_id>-node<node>-attempt<attempt>.json (not
// when `dir` is empty): the job's id (LOCKSTEP_JOB_ID) keeps another job's
// report in the same directory, before or at the same time, from replacing
// it. Nothing when no rank issued a collective.
void publish_report(const Postmortem& postmortem, const std::string& dir,
                    const std::string& job_id, int node, int attempt);

}  // namespace lockstep::launcher
