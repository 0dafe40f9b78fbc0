// distributed/launch_env: rank discovery from each launcher's variables, precedence,
// validation errors (each names the variable), and the LOCKSTEP_* settings.
// The environment is an injected map; nothing here calls setenv.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/env_slurm.h"
#include "lockstep/distributed/store/listen_address.h"
#include "lockstep/distributed/wire_protocol.h"
#include "support/env_lookup.h"
#include "support/test_util.h"

using lockstep::distributed::DebugLevel;
using lockstep::distributed::parse_host_port;
using lockstep::distributed::RankInfo;
using lockstep::distributed::read_rank_info;
using lockstep::testing::env_lookup;
using lockstep::testing::error_of;
using Catch::Matchers::Contains;

namespace {

using Vars = std::map<std::string, std::string>;

RankInfo read(const Vars& vars) { return read_rank_info(env_lookup(vars)); }

std::string error_for(const Vars& vars) {
  return error_of([&] { read(vars); });
}

const Vars kLockstep = {{"LOCKSTEP_RANK", "3"},           {"LOCKSTEP_WORLD_SIZE", "4"},
                        {"LOCKSTEP_LOCAL_RANK", "1"},     {"LOCKSTEP_LOCAL_WORLD_SIZE", "2"},
                        {"LOCKSTEP_NODE_RANK", "1"},      {"LOCKSTEP_STORE_ADDR", "10.0.0.1:4000"},
                        {"LOCKSTEP_TOKEN", "abc123"}};

const Vars kTorchrun = {{"RANK", "2"},           {"WORLD_SIZE", "3"},
                        {"LOCAL_RANK", "2"},     {"LOCAL_WORLD_SIZE", "3"},
                        {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}};

Vars merged(Vars a, const Vars& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

}  // namespace

TEST_CASE("env: no launcher variables means one process", "[env]") {
  const auto info = read({});
  CHECK(info.source == "none");
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.local_world_size == 1);
  CHECK(info.node_rank == 0);
  CHECK_FALSE(info.has_store_address());
  CHECK(info.token.empty());
  CHECK(info.backend.empty());
  CHECK(info.debug == DebugLevel::Off);
  CHECK_FALSE(info.timeout.has_value());
}

TEST_CASE("env: lockstep-run variables", "[env]") {
  const auto info = read(kLockstep);
  CHECK(info.source == "lockstep-run");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "10.0.0.1");
  CHECK(info.store_port == 4000);
  CHECK(info.token == "abc123");
}

TEST_CASE("env: torchrun variables", "[env]") {
  const auto info = read(kTorchrun);
  CHECK(info.source == "torchrun");
  CHECK(info.rank == 2);
  CHECK(info.world_size == 3);
  CHECK(info.local_rank == 2);
  CHECK(info.local_world_size == 3);
  CHECK(info.node_rank == 0);
  CHECK(info.store_host == "node0");
  CHECK(info.store_port == 29500);

  // torchrun's GROUP_RANK is the node rank.
  CHECK(read(merged(kTorchrun, {{"RANK", "1"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"},
                                {"GROUP_RANK", "1"}}))
            .node_rank == 1);
}

TEST_CASE("env: rank 0's store stays on loopback only when every rank is on this host", "[env]") {
  using lockstep::distributed::every_rank_on_this_host;
  // Set by hand on two hosts, as an old launcher did: no local world size.
  // node0 may be a name this host maps to 127.0.1.1 (Debian does), which the
  // other host resolves to node0's real address.
  const Vars by_hand = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"},
                        {"MASTER_PORT", "29500"}};
  CHECK_FALSE(every_rank_on_this_host(read(by_hand)));
  CHECK_FALSE(every_rank_on_this_host(read(merged(by_hand, {{"LOCAL_RANK", "0"}}))));
  // An address that cannot name another host, or the launcher's word.
  for (const char* loopback : {"localhost", "127.0.0.1", "127.0.1.1", "::1", "[::1]"}) {
    CAPTURE(loopback);
    CHECK(every_rank_on_this_host(read(merged(by_hand, {{"MASTER_ADDR", loopback}}))));
  }
  CHECK(every_rank_on_this_host(read(merged(by_hand, {{"LOCAL_WORLD_SIZE", "2"}}))));
  CHECK_FALSE(every_rank_on_this_host(read(merged(by_hand, {{"LOCAL_WORLD_SIZE", "1"}}))));
  CHECK(every_rank_on_this_host(read(kTorchrun)));
}

TEST_CASE("env: under mpirun rank 0 shares a loopback address only with ranks on its host",
          "[env]") {
  using lockstep::distributed::address_for_peers;
  const auto mpi = [](const Vars& vars) {
    return read_rank_info(env_lookup(vars), {.allow_missing_store = true});
  };
  const std::string interface = lockstep::distributed::first_interface_ipv4();
  // PMI_RANK and PMI_SIZE alone (as Flux sets them): the ranks may be on two hosts.
  const auto unknown = mpi({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}});
  CHECK(address_for_peers(unknown) == (interface.empty() ? "127.0.0.1" : interface));
  // The launcher's word that every rank is here, or that some are not.
  CHECK(address_for_peers(mpi({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALNRANKS", "4"}})) ==
        "127.0.0.1");
  const auto two_hosts = mpi({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  if (interface.empty())
    CHECK_THAT(error_of([&] { address_for_peers(two_hosts); }), Contains("LOCKSTEP_STORE_ADDR"));
  else
    CHECK(address_for_peers(two_hosts) == interface);
}

TEST_CASE("env: a local world size without a local rank assumes nodes of that size", "[env]") {
  const auto info = read({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"},
                          {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.node_rank == 1);
}

TEST_CASE("env: Open MPI variables", "[env]") {
  const auto info = read({{"OMPI_COMM_WORLD_RANK", "5"},
                          {"OMPI_COMM_WORLD_SIZE", "8"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"LOCKSTEP_STORE_ADDR", "host:1"}});
  CHECK(info.source == "open-mpi");
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.node_rank == 1);  // 5 / 4: nodes of equal size
  CHECK(info.store_host == "host");
  CHECK(info.store_port == 1);
}

TEST_CASE("env: MPICH / PMI variables", "[env]") {
  SECTION("with local variables") {
    const auto info = read({{"PMI_RANK", "1"},
                            {"PMI_SIZE", "2"},
                            {"MPI_LOCALRANKID", "1"},
                            {"MPI_LOCALNRANKS", "2"},
                            {"MASTER_ADDR", "127.0.0.1"},
                            {"MASTER_PORT", "1234"}});
    CHECK(info.source == "pmi");
    CHECK(info.rank == 1);
    CHECK(info.world_size == 2);
    CHECK(info.local_rank == 1);
    CHECK(info.local_world_size == 2);
    CHECK(info.store_host == "127.0.0.1");
    CHECK(info.store_port == 1234);
  }
  SECTION("with Cray's local variables (PALS, aprun)") {
    // mpiexec -n 4 --ppn 2 with MPICH_RANK_REORDER_METHOD=0: ranks 1 and 3
    // on the second node, local ranks 0 and 1 there.
    const Vars cray = {{"PMI_RANK", "1"},       {"PMI_SIZE", "4"},
                       {"PMI_LOCAL_RANK", "0"}, {"PMI_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "h"},    {"MASTER_PORT", "1"}};
    const auto info = read(cray);
    CHECK(info.source == "pmi");
    CHECK(info.rank == 1);
    CHECK(info.local_rank == 0);
    CHECK(info.local_world_size == 2);
    CHECK(info.local_world_size_given);
    CHECK(read(merged(cray, {{"PMI_RANK", "3"}, {"PMI_LOCAL_RANK", "1"}})).local_rank == 1);
    CHECK_THAT(error_for(merged(cray, {{"PMI_LOCAL_RANK", "2"}})),
               Contains("PMI_LOCAL_RANK=2") && Contains("PMI_LOCAL_SIZE=2"));
  }
  SECTION("without local variables: one node assumed") {
    const auto info = read({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MASTER_ADDR", "h"},
                            {"MASTER_PORT", "1"}});
    CHECK(info.local_rank == 2);
    CHECK(info.local_world_size == 3);
    CHECK(info.node_rank == 0);
  }
}

TEST_CASE("env: Slurm variables", "[env]") {
  const Vars task = {{"SLURM_PROCID", "3"},        {"SLURM_NTASKS", "4"},
                     {"SLURM_LOCALID", "1"},       {"SLURM_NTASKS_PER_NODE", "2"},
                     {"SLURM_NODEID", "1"},        {"SLURM_STEP_ID", "0"},
                     {"LOCKSTEP_STORE_ADDR", "[::1]:29500"}};
  const auto info = read(task);
  CHECK(info.source == "slurm");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "::1");
  CHECK(info.store_port == 29500);
  CHECK_FALSE(info.rank0_serves_store);  // LOCKSTEP_STORE_ADDR: served elsewhere

  // The step's own counts win over the job's: srun -n2 inside sbatch -n4.
  const auto step = read(merged(task, {{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"},
                                       {"SLURM_STEP_NUM_TASKS", "2"},
                                       {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}}));
  CHECK(step.world_size == 2);
  CHECK(step.local_world_size == 1);

  // Without --ntasks-per-node only the run-length list tells this node's size:
  // node 1 of "3,1(x2)" has 1 task.
  Vars uneven = merged(task, {{"SLURM_TASKS_PER_NODE", "3,1(x2)"}, {"SLURM_NTASKS", "5"},
                              {"SLURM_LOCALID", "0"}});
  uneven.erase("SLURM_NTASKS_PER_NODE");
  CHECK(read(uneven).local_world_size == 1);
  CHECK(read(merged(uneven, {{"SLURM_NODEID", "0"}, {"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "2"}}))
            .local_world_size == 3);
  CHECK_THAT(error_for(merged(uneven, {{"SLURM_TASKS_PER_NODE", "3,x"}})),
             Contains("SLURM_TASKS_PER_NODE='3,x'"));

  // SLURM_NTASKS alone (an allocation shell, no srun) is one process, and so
  // is a batch script's shell, which has SLURM_PROCID=0 but no step.
  CHECK(read({{"SLURM_NTASKS", "4"}}).source == "none");
  const auto batch = read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "7"},
                           {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_NODELIST", "n1"}});
  CHECK(batch.source == "none");
  CHECK(batch.world_size == 1);
  CHECK(read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEPID", "0"},
              {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
            .source == "slurm");  // older Slurm: SLURM_STEPID only
}

TEST_CASE("env: a WORLD_SIZE exported for every srun task leaves the ranks to Slurm", "[env]") {
  // PyTorch's Slurm recipes: the batch script exports WORLD_SIZE, MASTER_ADDR
  // and MASTER_PORT, srun starts the tasks, each rank is SLURM_PROCID.
  const Vars recipe = {{"WORLD_SIZE", "4"}, {"MASTER_ADDR", "gpu01"}, {"MASTER_PORT", "29500"}};
  const Vars task = {{"SLURM_PROCID", "3"},  {"SLURM_STEP_NUM_TASKS", "4"},
                     {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
                     {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  const auto info = read(merged(recipe, task));
  CHECK(info.source == "slurm");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.store_host == "gpu01");
  CHECK(info.store_port == 29500);
  CHECK(info.rank0_serves_store);
  // With no launcher's rank at all, the world size still asks for its own.
  CHECK_THAT(error_for(recipe), Contains("RANK is not set"));
}

TEST_CASE("env: srun --mpi=pmi2 tasks are read as Slurm's and not as PMI's", "[env]") {
  // Slurm's pmi2 plugin sets PMI_RANK, PMI_SIZE and PMI_JOBID=<job>.<step>:
  // task 9 of 16 on the second node of two, 8 tasks each.
  const Vars task = {{"PMI_RANK", "9"},           {"PMI_SIZE", "16"},
                     {"PMI_JOBID", "77.0"},       {"PMI_FD", "11"},
                     {"SLURM_PROCID", "9"},       {"SLURM_STEP_NUM_TASKS", "16"},
                     {"SLURM_LOCALID", "1"},      {"SLURM_NODEID", "1"},
                     {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"},
                     {"SLURM_JOB_ID", "77"},      {"SLURM_STEP_ID", "0"},
                     {"SLURM_STEP_NODELIST", "gpu[01-02]"}, {"SLURMD_NODENAME", "gpu02"}};
  const auto info = read(task);
  CHECK(info.source == "slurm");
  CHECK(info.rank == 9);
  CHECK(info.world_size == 16);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 8);
  CHECK(info.node_rank == 1);
  CHECK(info.store_host == "gpu01");
  CHECK(info.rank0_serves_store);
  // An mpiexec inside the allocation: PMI_* are its ranks', SLURM_* its proxies'.
  const auto mpiexec = read(merged(task, {{"PMI_JOBID", "kvs_1234_0"}, {"SLURM_PROCID", "1"},
                                          {"SLURM_STEP_NUM_TASKS", "2"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                                          {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "1"},
                                          {"MASTER_ADDR", "gpu01"}, {"MASTER_PORT", "5"}}));
  CHECK(mpiexec.source == "pmi");
  CHECK(mpiexec.rank == 9);
  CHECK(mpiexec.world_size == 16);
}

TEST_CASE("env: mpiexec inside an srun --mpi=pmi2 task gives every rank its PMI rank",
          "[env]") {
  // srun -n1 --mpi=pmi2 --pty bash, then mpiexec -n 4: hydra sets PMI_RANK,
  // PMI_SIZE and MPI_LOCAL* for its ranks but not PMI_JOBID, so each keeps the
  // shell's PMI_JOBID=<job>.<step> and SLURM_PROCID=0 of one task.
  const Vars shell = {{"PMI_JOBID", "77.3"},        {"SLURM_PROCID", "0"},
                      {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_NTASKS", "1"},
                      {"SLURM_LOCALID", "0"},        {"SLURM_NODEID", "0"},
                      {"SLURM_STEP_TASKS_PER_NODE", "1"},
                      {"SLURM_JOB_ID", "77"},        {"SLURM_STEP_ID", "3"},
                      {"SLURM_STEP_NODELIST", "gpu01"}, {"SLURMD_NODENAME", "gpu01"},
                      {"MASTER_ADDR", "gpu01"},      {"MASTER_PORT", "29500"}};
  std::vector<int> ranks;
  for (int r = 0; r < 4; ++r) {
    const auto info = read(merged(shell, {{"PMI_RANK", std::to_string(r)}, {"PMI_SIZE", "4"},
                                          {"MPI_LOCALRANKID", std::to_string(r)},
                                          {"MPI_LOCALNRANKS", "4"}}));
    CHECK(info.source == "pmi");
    CHECK(info.world_size == 4);
    CHECK(info.local_world_size == 4);
    ranks.push_back(info.rank);
  }
  CHECK(ranks == std::vector<int>{0, 1, 2, 3});
  // mpiexec over two nodes: the ranks on the second keep the SLURM_* of the
  // proxy srun started there (task 1 of 2), PMI_JOBID of the proxies' step.
  const auto remote = read(merged(shell, {{"SLURM_PROCID", "1"}, {"SLURM_NODEID", "1"},
                                          {"SLURM_STEP_NUM_TASKS", "2"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                                          {"SLURM_STEP_NODELIST", "gpu[01-02]"},
                                          {"SLURMD_NODENAME", "gpu02"}, {"PMI_RANK", "5"},
                                          {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"},
                                          {"MPI_LOCALNRANKS", "4"}}));
  CHECK(remote.source == "pmi");
  CHECK(remote.rank == 5);
  CHECK(remote.world_size == 8);
  CHECK(remote.local_rank == 1);
}

TEST_CASE("env: launchers that give the world size only over their own protocol are refused",
          "[env]") {
  // mpiexec -pmi-port (hydra): PMI_PORT and PMI_ID, the rank, but no
  // PMI_RANK or PMI_SIZE; read as no launcher, every rank was rank 0 of 1.
  const Vars port_mode = {{"PMI_PORT", "node1:39211"}, {"PMI_ID", "2"},
                          {"MPI_LOCALRANKID", "2"},    {"MPI_LOCALNRANKS", "4"}};
  CHECK_THAT(error_for(port_mode), Contains("PMI_PORT='node1:39211' and PMI_ID='2'") &&
                                       Contains("without -pmi-port"));
  CHECK_THAT(error_for({{"PMI_ID", "0"}}), Contains("mpiexec -pmi-port"));
  // With the rank variables (hydra's default mode), PMI_PORT is not looked at.
  CHECK(read(merged(port_mode, {{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MASTER_ADDR", "h"},
                                {"MASTER_PORT", "5"}}))
            .rank == 2);

  // prterun -n 4 inside an srun task: each process keeps the task's SLURM_*
  // (task 0 of 1) and gets PMIX_RANK in PRRTE's namespace, with no size.
  const Vars task = {{"SLURM_PROCID", "0"},   {"SLURM_STEP_NUM_TASKS", "1"},
                     {"SLURM_LOCALID", "0"},  {"SLURM_NODEID", "0"},
                     {"SLURM_JOB_ID", "77"},  {"SLURM_STEP_ID", "0"},
                     {"SLURM_STEP_TASKS_PER_NODE", "1"}, {"SLURM_STEP_NODELIST", "gpu01"}};
  CHECK_THAT(error_for(merged(task, {{"PMIX_RANK", "3"}, {"PMIX_NAMESPACE", "prterun-gpu01-9@1"}})),
             Contains("PMIX_RANK='3' in PMIx namespace 'prterun-gpu01-9@1'") &&
                 Contains("inside Slurm task 0 of 1"));
  // srun --mpi=pmix's own tasks are Slurm's.
  const auto pmix_task = read(merged(task, {{"PMIX_RANK", "0"},
                                            {"PMIX_NAMESPACE", "slurm.pmix.77.0"}}));
  CHECK(pmix_task.source == "slurm");
  CHECK(pmix_task.world_size == 1);
}

TEST_CASE("env: under srun rank 0 serves the store at an address every task derives",
          "[env]") {
  const Vars task = {{"SLURM_PROCID", "1"},          {"SLURM_STEP_NUM_TASKS", "4"},
                     {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "0"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                     {"SLURM_JOB_ID", "4242"},       {"SLURM_STEP_ID", "3"},
                     {"SLURM_STEP_NODELIST", "gpu[007-008]"}, {"SLURMD_NODENAME", "gpu007"}};
  const auto info = read(task);
  CHECK(info.store_host == "gpu007");
  CHECK(info.store_port >= 20000);
  CHECK(info.store_port < 32000);
  CHECK(info.rank0_serves_store);
  CHECK_THAT(info.store_address_from, Contains("SLURM_STEP_NODELIST") && Contains("MASTER_PORT"));
  // Every task derives the same port and token; the next step other ones.
  const auto other_task = read(merged(task, {{"SLURM_PROCID", "3"}, {"SLURM_NODEID", "1"},
                                             {"SLURMD_NODENAME", "gpu008"}}));
  CHECK(other_task.store_port == info.store_port);
  CHECK(other_task.token == info.token);
  CHECK(info.token.size() == 32);
  const auto next_step = read(merged(task, {{"SLURM_STEP_ID", "4"}}));
  CHECK(next_step.store_port != info.store_port);
  CHECK(next_step.token != info.token);
  CHECK(read(merged(task, {{"SLURM_JOB_ID", "4243"}})).token != info.token);
  // LOCKSTEP_TOKEN, when set, is the token.
  CHECK(read(merged(task, {{"LOCKSTEP_TOKEN", "secret"}})).token == "secret");
  // MASTER_ADDR/MASTER_PORT choose the address; rank 0 still serves it.
  const auto master = read(merged(task, {{"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "3000"}}));
  CHECK(master.store_host == "10.1.1.1");
  CHECK(master.store_port == 3000);
  CHECK(master.rank0_serves_store);
  // One task needs no store at all.
  CHECK_FALSE(read(merged(task, {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
                                 {"SLURM_STEP_NUM_TASKS", "1"},
                                 {"SLURM_STEP_TASKS_PER_NODE", "1"}}))
                  .has_store_address());
  // Task 0 must be where the others look for it.
  CHECK_THAT(error_for(merged(task, {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
                                     {"SLURMD_NODENAME", "gpu008"}})),
             Contains("gpu008") && Contains("gpu007") && Contains("MASTER_ADDR"));
  CHECK_THAT(error_for(merged(task, {{"SLURM_STEP_NODELIST", "gpu[007-008"}})),
             Contains("SLURM_STEP_NODELIST"));
}

TEST_CASE("env: Slurm's node lists and tasks-per-node lists", "[env]") {
  using lockstep::distributed::slurm::first_host;
  using lockstep::distributed::slurm::tasks_on_node;
  CHECK(first_host("node01", "L") == "node01");
  CHECK(first_host("node[01-04,07],gpu5", "L") == "node01");
  CHECK(first_host("node[7,1-3]", "L") == "node7");
  CHECK(first_host("rack[2-3]-n[005-006]", "L") == "rack2-n005");
  CHECK(first_host("a.example.org,b.example.org", "L") == "a.example.org");
  CHECK_THAT(error_of([] { first_host("", "L"); }), Contains("L=''"));
  CHECK_THAT(error_of([] { first_host("node[01-04", "L"); }), Contains("node[01-04"));
  CHECK_THAT(error_of([] { first_host("node[x-y]", "L"); }), Contains("[x-y]"));
  CHECK_THAT(error_of([] { first_host("node]1", "L"); }), Contains("node]1"));

  CHECK(tasks_on_node("4", 0, "T") == 4);
  CHECK(tasks_on_node("2(x3),1", 0, "T") == 2);
  CHECK(tasks_on_node("2(x3),1", 2, "T") == 2);
  CHECK(tasks_on_node("2(x3),1", 3, "T") == 1);
  CHECK_THAT(error_of([] { tasks_on_node("2(x3),1", 4, "T"); }),
             Contains("lists 4 nodes") && Contains("node 4"));
  for (const char* bad : {"", "2(x)", "2(3)", "0", "2,,1", "x", "2(x3"})
    CHECK_THAT(error_of([&] { tasks_on_node(bad, 0, "T"); }), Contains("T='"));
}

TEST_CASE("env: under torchrun rank 0 serves the store beside the agent's", "[env]") {
  // --standalone and c10d rendezvous: MASTER_PORT is free for rank 0.
  const auto standalone = read(merged(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "False"},
                                                  {"TORCHELASTIC_RUN_ID", "a1b2"}}));
  CHECK(standalone.store_port == 29500);
  CHECK(standalone.rank0_serves_store);
  CHECK(standalone.token.size() == 32);
  // The static rendezvous: the agent's store is on MASTER_PORT; lockstep's on the next.
  const Vars agent = merged(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                        {"TORCHELASTIC_RUN_ID", "none"},
                                        {"TORCHELASTIC_RESTART_COUNT", "0"}});
  const auto info = read(agent);
  CHECK(info.store_host == "node0");
  CHECK(info.store_port == 29501);
  CHECK(info.rank0_serves_store);
  CHECK_THAT(info.store_address_from, Contains("MASTER_PORT=29500") && Contains("--master_port"));
  CHECK(read(merged(agent, {{"MASTER_PORT", "65535"}})).store_port == 65534);
  // Every worker derives the same token, on every node: after a worker on
  // one node failed, that node's agent counts a restart and the others' not.
  CHECK(read(merged(agent, {{"RANK", "0"}, {"LOCAL_RANK", "0"}})).token == info.token);
  CHECK(read(merged(agent, {{"TORCHELASTIC_RESTART_COUNT", "1"}})).token == info.token);
  CHECK(read(merged(agent, {{"TORCHELASTIC_RUN_ID", "other"}})).token != info.token);
  CHECK(read(merged(agent, {{"LOCKSTEP_TOKEN", "s"}})).token == "s");
  CHECK(read(merged(agent, {{"LOCKSTEP_TOKEN", ""}})).token.empty());
}

TEST_CASE("env: MASTER_ADDR/MASTER_PORT under any launcher mean rank 0 serves there", "[env]") {
  const auto mpi = read({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "h"}, {"MASTER_PORT", "5"}});
  CHECK(mpi.rank0_serves_store);
  CHECK(mpi.store_address_from == "MASTER_ADDR/MASTER_PORT");
  CHECK(mpi.token.empty());  // only torchrun and Slurm derive one
  const auto elsewhere = read({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                               {"LOCKSTEP_STORE_ADDR", "h:5"}});
  CHECK_FALSE(elsewhere.rank0_serves_store);
  CHECK_FALSE(read(kLockstep).rank0_serves_store);
}

TEST_CASE("env: PMIx variables", "[env]") {
  const auto info = read({{"PMIX_RANK", "1"}, {"PMIX_SIZE", "2"}, {"PMIX_LOCAL_RANK", "1"},
                          {"PMIX_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "5"}});
  CHECK(info.source == "pmix");
  CHECK(info.rank == 1);
  CHECK(info.world_size == 2);
  CHECK(info.local_world_size == 2);
  CHECK_THAT(error_for({{"PMIX_RANK", "0"}}), Contains("PMIX_SIZE is not set"));
}

TEST_CASE("env: a rank started by a lockstep-run of another wire protocol is refused, naming "
          "both builds",
          "[env][wire_protocol]") {
  // Before, the rank read the variables and heartbeats of another protocol as
  // its own and went on.
  const std::string mine = std::to_string(lockstep::distributed::kWireProtocol);
  const std::string other = std::to_string(lockstep::distributed::kWireProtocol + 1);
  const auto e = error_for(merged(
      kLockstep, {{"LOCKSTEP_LAUNCHER_WIRE", other}, {"LOCKSTEP_LAUNCHER_VERSION", "9.9.0"}}));
  CHECK_THAT(e, Contains(fmt::format("this program runs lockstep {} wire {}, but the lockstep-run "
                                     "that started it runs lockstep 9.9.0 wire {}",
                                     LOCKSTEP_VERSION_STRING, mine, other)) &&
                    Contains("the same install's bin/lockstep-run"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_LAUNCHER_WIRE", "seven"}})),
             Contains("wire seven (LOCKSTEP_LAUNCHER_WIRE=seven)"));
  // The same protocol, or none given (rank variables set by hand): read as before.
  CHECK(read(merged(kLockstep, {{"LOCKSTEP_LAUNCHER_WIRE", mine}})).rank == 3);
  CHECK(read(kLockstep).rank == 3);
  // Another launcher's rank leaves it alone (an outer lockstep-run's value).
  CHECK(read(merged(kTorchrun, {{"LOCKSTEP_LAUNCHER_WIRE", other}})).source == "torchrun");
}

TEST_CASE("env: precedence lockstep-run > torchrun > Open MPI > PMI > Slurm > PMIx", "[env]") {
  const Vars ompi = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}};
  const Vars pmi = {{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}};
  const Vars slurm = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}};
  const Vars pmix = {{"PMIX_RANK", "0"}, {"PMIX_SIZE", "1"}};
  CHECK(read(merged(merged(merged(merged(kLockstep, kTorchrun), ompi), pmi), slurm)).source ==
        "lockstep-run");
  CHECK(read(merged(merged(merged(kTorchrun, ompi), pmi), slurm)).source == "torchrun");
  CHECK(read(merged(merged(ompi, pmi), slurm)).source == "open-mpi");
  CHECK(read(merged(pmi, slurm)).source == "pmi");
  CHECK(read(merged(slurm, pmix)).source == "slurm");
  CHECK(read(pmix).source == "pmix");

  // lockstep-run's store address wins over MASTER_*; torchrun uses only MASTER_*.
  const auto both = read(merged(kLockstep, kTorchrun));
  CHECK(both.store_host == "10.0.0.1");
  CHECK(both.rank == 3);
  const auto torch = read(merged(kTorchrun, {{"LOCKSTEP_STORE_ADDR", "other:1"}}));
  CHECK(torch.store_host == "node0");
  // For MPI launchers LOCKSTEP_STORE_ADDR comes before MASTER_*.
  const auto mpi = read(merged(merged(ompi, {{"OMPI_COMM_WORLD_SIZE", "2"}}),
                               {{"LOCKSTEP_STORE_ADDR", "a:1"}, {"MASTER_ADDR", "b"},
                                {"MASTER_PORT", "2"}}));
  CHECK(mpi.store_host == "a");
}

TEST_CASE("env: inconsistent rank variables name the variable", "[env]") {
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_RANK", "4"}})),
             Contains("LOCKSTEP_RANK=4") && Contains("LOCKSTEP_WORLD_SIZE=4"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_RANK", "-1"}})), Contains("LOCKSTEP_RANK=-1"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_RANK", "one"}})),
             Contains("LOCKSTEP_RANK='one'") && Contains("not a whole number"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_RANK", "1x"}})), Contains("LOCKSTEP_RANK"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_RANK", ""}})), Contains("LOCKSTEP_RANK"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_RANK", "99999999999"}})),
             Contains("LOCKSTEP_RANK"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_WORLD_SIZE", "0"}})),
             Contains("LOCKSTEP_WORLD_SIZE=0"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_LOCAL_RANK", "2"}})),
             Contains("LOCKSTEP_LOCAL_RANK=2") && Contains("LOCKSTEP_LOCAL_WORLD_SIZE=2"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_LOCAL_WORLD_SIZE", "5"}})),
             Contains("LOCKSTEP_LOCAL_WORLD_SIZE=5"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_NODE_RANK", "-2"}})),
             Contains("LOCKSTEP_NODE_RANK"));
  CHECK_THAT(error_for({{"LOCKSTEP_RANK", "0"}}), Contains("LOCKSTEP_WORLD_SIZE is not set"));
  CHECK_THAT(error_for({{"WORLD_SIZE", "2"}}), Contains("RANK is not set"));
  CHECK_THAT(error_for({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
             Contains("OMPI_COMM_WORLD_RANK=2"));
  CHECK_THAT(error_for({{"PMI_RANK", "0"}, {"PMI_SIZE", "x"}}), Contains("PMI_SIZE"));
  CHECK_THAT(error_for({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"},
                        {"SLURM_LOCALID", "-1"}}),
             Contains("SLURM_LOCALID"));
}

TEST_CASE("env: world size > 1 needs a store address", "[env]") {
  Vars no_store = kLockstep;
  no_store.erase("LOCKSTEP_STORE_ADDR");
  CHECK_THAT(error_for(no_store), Contains("LOCKSTEP_WORLD_SIZE=4") && Contains("LOCKSTEP_STORE_ADDR"));
  CHECK(read_rank_info(env_lookup(no_store), {.allow_missing_store = true}).world_size == 4);

  CHECK_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
             Contains("WORLD_SIZE=2") && Contains("MASTER_ADDR"));
  CHECK_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
             Contains("MASTER_PORT is not"));
  CHECK_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
             Contains("MASTER_ADDR is not"));
  // Set, but to nothing: a batch script's $(scontrol show hostnames ...) that failed.
  CHECK_THAT(error_for({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""},
                        {"MASTER_PORT", "1"}}),
             Contains("MASTER_ADDR is set but empty") && !Contains("MASTER_ADDR is not"));
  CHECK_THAT(error_for(merged(kTorchrun, {{"MASTER_PORT", "70000"}})), Contains("MASTER_PORT"));
  CHECK_THAT(error_for(merged(kTorchrun, {{"MASTER_PORT", "http"}})), Contains("MASTER_PORT"));
  // The error asks for a value the variable may hold, not for 0.
  CHECK_THAT(error_for(merged(kTorchrun, {{"MASTER_PORT", "29500 "}})),
             Contains("MASTER_PORT='29500 '") && Contains("integer of at least 1") &&
                 !Contains("=0"));
  CHECK_THAT(error_for(merged(kTorchrun, {{"WORLD_SIZE", "four"}})),
             Contains("integer of at least 1") && !Contains("=0"));
  CHECK_THAT(error_for(merged(kLockstep, {{"LOCKSTEP_STORE_ADDR", "nohost"}})),
             Contains("LOCKSTEP_STORE_ADDR"));

  // World size 1 needs none, and a lone MASTER_ADDR from the shell is ignored.
  CHECK(read({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world_size == 1);
  CHECK_FALSE(read({{"MASTER_ADDR", "localhost"}}).has_store_address());
}

TEST_CASE("env: LOCKSTEP_DEBUG", "[env]") {
  CHECK(read({{"LOCKSTEP_DEBUG", "off"}}).debug == DebugLevel::Off);
  CHECK(read({{"LOCKSTEP_DEBUG", ""}}).debug == DebugLevel::Off);
  CHECK(read({{"LOCKSTEP_DEBUG", "info"}}).debug == DebugLevel::Info);
  CHECK(read({{"LOCKSTEP_DEBUG", "INFO"}}).debug == DebugLevel::Info);
  CHECK(read({{"LOCKSTEP_DEBUG", "detail"}}).debug == DebugLevel::Detail);
  CHECK(read({{"LOCKSTEP_DEBUG", "2"}}).debug == DebugLevel::Detail);
  CHECK_THAT(error_for({{"LOCKSTEP_DEBUG", "verbose"}}),
             Contains("LOCKSTEP_DEBUG='verbose'") && Contains("off, info or detail"));
}

TEST_CASE("env: LOCKSTEP_TIMEOUT_S", "[env]") {
  using std::chrono::milliseconds;
  CHECK(read({{"LOCKSTEP_TIMEOUT_S", "30"}}).timeout == milliseconds(30000));
  CHECK(read({{"LOCKSTEP_TIMEOUT_S", "0.25"}}).timeout == milliseconds(250));
  for (const char* bad : {"0", "-5", "ten", "", "5s", "inf", "nan", "1e30"}) {
    INFO("LOCKSTEP_TIMEOUT_S=" << bad);
    CHECK_THAT(error_for({{"LOCKSTEP_TIMEOUT_S", bad}}), Contains("LOCKSTEP_TIMEOUT_S"));
  }
  // A positive number past the longest timeout says so; before, the error
  // asked for "a positive number of seconds", which it was.
  CHECK(read({{"LOCKSTEP_TIMEOUT_S", "31536000"}}).timeout == milliseconds(31536000000));
  for (const char* long_one : {"99999999999", "1e9"}) {
    INFO("LOCKSTEP_TIMEOUT_S=" << long_one);
    CHECK_THAT(error_for({{"LOCKSTEP_TIMEOUT_S", long_one}}),
               Contains("is more than a year (31536000 seconds), the most lockstep takes") &&
                   !Contains("positive number"));
  }
}

TEST_CASE("env: LOCKSTEP_BACKEND and LOCKSTEP_TOKEN", "[env]") {
  CHECK(read({{"LOCKSTEP_BACKEND", "gloo"}}).backend == "gloo");
  CHECK(read({{"LOCKSTEP_BACKEND", "MPI"}}).backend == "mpi");
  CHECK(read({{"LOCKSTEP_BACKEND", ""}}).backend.empty());
  CHECK_THAT(error_for({{"LOCKSTEP_BACKEND", "gloo mpi"}}), Contains("LOCKSTEP_BACKEND"));
  // The token is read whatever the launcher.
  CHECK(read(merged(kTorchrun, {{"LOCKSTEP_TOKEN", "t0k"}})).token == "t0k");
}

TEST_CASE("env: LOCKSTEP_HOST_CACHE_MB", "[env]") {
  CHECK_FALSE(lockstep::runtime::read_host_cache_mb(env_lookup({})).has_value());
  CHECK(lockstep::runtime::read_host_cache_mb(env_lookup({{"LOCKSTEP_HOST_CACHE_MB", "0"}})) == 0);
  CHECK(lockstep::runtime::read_host_cache_mb(env_lookup({{"LOCKSTEP_HOST_CACHE_MB", "512"}})) == 512);
  CHECK_THAT(error_of([] {
               lockstep::runtime::read_host_cache_mb(env_lookup({{"LOCKSTEP_HOST_CACHE_MB", "1G"}}));
             }),
             Contains("LOCKSTEP_HOST_CACHE_MB='1G' is not a whole number"));
  CHECK_THAT(error_of([] {
               lockstep::runtime::read_host_cache_mb(env_lookup({{"LOCKSTEP_HOST_CACHE_MB", "-1"}}));
             }),
             Contains("LOCKSTEP_HOST_CACHE_MB=-1 is out of range"));
}

TEST_CASE("env: LOCKSTEP_RESTART_COUNT", "[env]") {
  using lockstep::distributed::read_restart_count;
  CHECK(read_restart_count(env_lookup({})) == 0);
  CHECK(read_restart_count(env_lookup({{"LOCKSTEP_RESTART_COUNT", "3"}})) == 3);
  CHECK_THAT(error_of([] { read_restart_count(env_lookup({{"LOCKSTEP_RESTART_COUNT", "once"}})); }),
             Contains("LOCKSTEP_RESTART_COUNT='once' is not a whole number"));
  CHECK_THAT(error_of([] { read_restart_count(env_lookup({{"LOCKSTEP_RESTART_COUNT", "-1"}})); }),
             Contains("LOCKSTEP_RESTART_COUNT=-1 is out of range"));
}

TEST_CASE("env: parse_host_port", "[env]") {
  CHECK(parse_host_port("127.0.0.1:29500", "X") == std::pair<std::string, int>("127.0.0.1", 29500));
  CHECK(parse_host_port("node-7.example:1", "X") == std::pair<std::string, int>("node-7.example", 1));
  CHECK(parse_host_port("[::1]:65535", "X") == std::pair<std::string, int>("::1", 65535));
  CHECK(parse_host_port("[fe80::1%eth0]:80", "X") ==
        std::pair<std::string, int>("fe80::1%eth0", 80));
  for (const char* bad : {"host", "host:", ":80", "host:0", "host:65536", "host:-1", "host:8o",
                          "::1:80", "[::1]80", "[::1]:", "[]:80", "[::1"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_host_port(bad, "MY_VAR"); }), Contains("MY_VAR"));
  }
  CHECK_THAT(error_of([&] { parse_host_port("h:99999", "MY_VAR"); }), Contains("bad port"));
}

TEST_CASE("rank_variables: what a launcher sets reads back as the same rank, under both names",
          "[env]") {
  for (const std::string host : {"10.0.0.7", "fd00::7"}) {
    INFO("store host " << host);
    RankInfo info;
    info.rank = 5;
    info.world_size = 8;
    info.local_rank = 1;
    info.local_world_size = 4;
    info.node_rank = 1;
    info.store_host = host;
    info.store_port = 29512;
    info.token = "secret";
    Vars vars;
    for (const auto& [name, value] : lockstep::distributed::rank_variables(info, 2, 29613))
      vars[name] = value;
    const RankInfo back = read(vars);
    CHECK(back.source == "lockstep-run");
    CHECK(back.rank == 5);
    CHECK(back.world_size == 8);
    CHECK(back.local_rank == 1);
    CHECK(back.local_world_size == 4);
    CHECK(back.node_rank == 1);
    CHECK(back.store_host == host);
    CHECK(back.store_port == 29512);
    CHECK(back.token == "secret");
    CHECK_FALSE(back.rank0_serves_store);
    CHECK(vars.at("LOCKSTEP_NUM_NODES") == "2");
    // torchrun's names carry the same values, for programs that read those.
    CHECK(vars.at("RANK") == "5");
    CHECK(vars.at("WORLD_SIZE") == "8");
    CHECK(vars.at("LOCAL_RANK") == "1");
    CHECK(vars.at("LOCAL_WORLD_SIZE") == "4");
    // MASTER_PORT is the port left for such a program's own store, not lockstep's.
    CHECK(vars.at("MASTER_ADDR") == host);
    CHECK(vars.at("MASTER_PORT") == "29613");
    // Without one (spawn's children), no MASTER_ADDR or MASTER_PORT.
    for (const auto& [name, value] : lockstep::distributed::rank_variables(info, 1))
      CHECK((name != "MASTER_ADDR" && name != "MASTER_PORT"));
  }
}
