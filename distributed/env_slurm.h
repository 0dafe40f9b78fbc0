// distributed/env_slurm: Slurm's compact variable formats, read for launch_env.h.
//
// Slurm writes node lists compressed ("node[01-04,07],gpu5") and tasks per
// node run-length encoded ("2(x3),1" is 2,2,2,1). Every task of a step sees
// the same values, so what is derived from them here (rank 0's host, the
// store's port) is the same on every rank without any exchange.
#pragma once

#include <string>

namespace lockstep::distributed::slurm {

// The first host of a node list: "node[01-04,07],gpu5" -> "node01",
// "rack[2-3]-n[5-6]" -> "rack2-n5". Throws naming `what` (the variable) when
// the list is empty or its brackets do not match.
std::string first_host(const std::string& nodelist, const std::string& what);

// The number of tasks on node `node_index` (0-based) of a tasks-per-node list:
// ("2(x3),1", 3) -> 1. Throws naming `what` when the list is malformed or
// shorter than node_index + 1 nodes.
int tasks_on_node(const std::string& tasks_per_node, int node_index, const std::string& what);

// The port rank 0 serves a step's store on, in [20000, 32000) (below Linux's
// ephemeral ports): a hash of the job and step ids, so that consecutive steps
// of one job and concurrent jobs on one node get different ports.
int store_port(const std::string& job_id, const std::string& step_id);

}  // namespace lockstep::distributed::slurm
