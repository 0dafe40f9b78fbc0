// distributed/postmortem and rank_postmortem: the post-mortem's JSON form,
// and the part a rank under another launcher writes of its own records.
// The environment is an injected map; nothing here calls setenv.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lockstep/collectives/init.h"
#include "lockstep/collectives/spawn.h"
#include "lockstep/distributed/flight_recorder.h"
#include "lockstep/distributed/postmortem.h"
#include "lockstep/distributed/rank_postmortem.h"
#include "support/env_lookup.h"
#include "support/temp_dir.h"
#include "support/test_util.h"

namespace ld = lockstep::distributed;
using lockstep::testing::env_lookup;
using lockstep::testing::error_of;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A recorder file laid out as flight_recorder.cpp lays it out (the reader
// refuses one of another size): magic, layout version, capacity, issued,
// then each entry's version, ordinal, seq, count, root, start_ns, end_ns,
// state, group size << 32 | rank in it, group (4 words), op (2) and dtype (1).
struct RecorderFile {
  static constexpr size_t kHeader = 4, kSlot = 16;
  std::vector<uint64_t> words =
      std::vector<uint64_t>(kHeader + kSlot * ld::kFlightRecorderEntries, 0);

  RecorderFile() {
    words[0] = 0x3130'4452'4346'4b4cULL;
    words[1] = 2;
    words[2] = ld::kFlightRecorderEntries;
  }
  uint64_t* slot(uint64_t ordinal) {
    return &words[kHeader + kSlot * ((ordinal - 1) % ld::kFlightRecorderEntries)];
  }
  // Records allreduce #ordinal of the default group, ended; `version` odd:
  // left mid-write.
  void record(uint64_t ordinal, uint64_t version) {
    words[3] = ordinal;  // issued
    uint64_t* w = slot(ordinal);
    w[0] = version;
    w[1] = ordinal;
    w[2] = ordinal;
    w[3] = 1000;
    w[4] = static_cast<uint64_t>(-1);
    w[5] = 1;
    w[6] = 2;
    w[7] = 1;                     // finished
    w[8] = uint64_t{4} << 32 | 1;  // rank 1 of 4
    std::memcpy(w + 9, "default", 7);
    std::memcpy(w + 13, "allreduce", 9);
    std::memcpy(w + 15, "f32", 3);
  }
  void write(const std::string& path) const {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(words.data()),
               static_cast<std::streamsize>(words.size() * sizeof(uint64_t)));
  }
};

}  // namespace

TEST_CASE("post-mortem: the JSON form keeps every field; malformed text is named",
          "[distributed][postmortem]") {
  ld::Postmortem pm{.cause = "rank 1 exited with code 7", .written_unix_s = 1.5e9, .world_size = 3};
  pm.ranks.push_back({.rank = 2, .node = 1, .host = "b", .pid = 42, .recorded = true});
  pm.ranks.back().entries.push_back({.group = "default", .op = "broadcast", .dtype = "i64",
                                     .group_size = 3, .group_rank = 2,
                                     .state = "finished", .seq = 7, .count = 2, .root = 1,
                                     .started_s_ago = 3.5, .ended_s_ago = 3.25});
  pm.ranks.back().entries.push_back({.group = "default", .op = "barrier", .state = "running",
                                     .seq = 8, .started_s_ago = 1.0});
  const ld::Postmortem back = ld::postmortem_from_json_text(ld::to_json_text(pm, 1));
  CHECK(back.cause == pm.cause);
  CHECK(back.written_unix_s == pm.written_unix_s);
  CHECK(back.world_size == 3);
  REQUIRE(back.ranks.size() == 1);
  const auto& r = back.ranks[0];
  CHECK((r.rank == 2 && r.node == 1 && r.host == "b" && r.pid == 42 && r.recorded));
  REQUIRE(r.entries.size() == 2);
  CHECK((r.entries[0].op == "broadcast" && r.entries[0].dtype == "i64" && r.entries[0].seq == 7 &&
         r.entries[0].count == 2 && r.entries[0].root == 1 && r.entries[0].state == "finished"));
  CHECK(r.entries[0].ended_s_ago == 3.25);
  CHECK((r.entries[0].group_size == 3 && r.entries[0].group_rank == 2));
  CHECK_FALSE(r.entries[1].ended_s_ago.has_value());
  // A part that does not say a group's size (an older lockstep's) reads as
  // not known.
  CHECK((r.entries[1].group_size == 0 && r.entries[1].group_rank == -1));

  CHECK_THAT(error_of([] { ld::postmortem_from_json_text("{\"cause\": 1}"); }),
             Contains("not a lockstep post-mortem"));
  CHECK_THAT(error_of([] { ld::postmortem_from_json_text("not json"); }),
             Contains("not a lockstep post-mortem"));
}

TEST_CASE("post-mortem: a rank under another launcher writes its own part when asked",
          "[distributed][postmortem]") {
  auto& recorder = ld::FlightRecorder::instance();
  const uint64_t done = recorder.started({.group = "pm-part", .op = "allreduce", .dtype = "f32",
                                          .seq = 1, .count = 1000});
  recorder.ended(done, true);
  recorder.started({.group = "pm-part", .op = "allreduce", .dtype = "f32", .group_size = 4,
                    .group_rank = 3, .seq = 2, .count = 1000});

  TempDir dir;
  const std::map<std::string, std::string> torchrun = {
      {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCKSTEP_POSTMORTEM_DIR", dir.str()}};
  const auto path = ld::write_rank_postmortem(env_lookup(torchrun), "it failed");
  REQUIRE(path.has_value());
  CHECK(*path == dir.str() + "/lockstep-postmortem-rank3.json");
  const ld::Postmortem part = ld::postmortem_from_json_text(read_file(*path));
  CHECK(part.cause == "it failed");
  CHECK(part.world_size == 4);
  CHECK(part.written_unix_s > 1.7e9);
  REQUIRE(part.ranks.size() == 1);
  CHECK(part.ranks[0].rank == 3);
  CHECK(part.ranks[0].pid == ::getpid());
  std::vector<std::string> states;
  for (const auto& e : part.ranks[0].entries)
    if (e.group == "pm-part") states.push_back(e.state);
  CHECK(states == std::vector<std::string>{"finished", "running"});
  // The group's size and the rank's rank in it, which tell its members.
  REQUIRE_FALSE(part.ranks[0].entries.empty());
  CHECK(part.ranks[0].entries.back().group_size == 4);
  CHECK(part.ranks[0].entries.back().group_rank == 3);

  // Not asked for, or under lockstep-run (which reads the recorder itself):
  // nothing is written.
  auto without_dir = torchrun;
  without_dir.erase("LOCKSTEP_POSTMORTEM_DIR");
  CHECK_FALSE(ld::write_rank_postmortem(env_lookup(without_dir), "x").has_value());
  auto launched = torchrun;
  launched["LOCKSTEP_FLIGHT_RECORDER"] = "/dev/shm/somewhere";
  std::filesystem::remove(*path);
  CHECK_FALSE(ld::write_rank_postmortem(env_lookup(launched), "x").has_value());
  CHECK(std::filesystem::is_empty(dir.str()));

  // A directory that cannot be written is said, and the run goes on.
  auto unwritable = torchrun;
  unwritable["LOCKSTEP_POSTMORTEM_DIR"] = dir.str() + "/missing/deeper";
  CHECK_FALSE(ld::write_rank_postmortem(env_lookup(unwritable), "x").has_value());
}

TEST_CASE("post-mortem: a rank's part removes what its killed predecessors left half written, "
          "and nothing else",
          "[distributed][postmortem]") {
  // A process killed between writing its part aside and renaming it leaves
  // the hidden file behind; the next write of that rank's part on that host
  // removes it.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);  // a pid that is gone
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof name - 1) == 0);
  const std::string host = name;

  TempDir dir;
  const auto temp = [&](int rank, const std::string& on, pid_t pid) {
    const std::string path =
        fmt::format("{}/.lockstep-postmortem-rank{}.json.{}.{}", dir.str(), rank, on, pid);
    std::ofstream(path) << "{\"cause\": \"cut";
    return path;
  };
  const std::string killed = temp(3, host, child);
  const std::string alive = temp(3, host, ::getppid());          // may still be writing
  const std::string elsewhere = temp(3, "another-host", child);  // its pids are not ours
  const std::string other_rank = temp(2, host, child);           // rank 2's to remove

  const std::map<std::string, std::string> torchrun = {
      {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCKSTEP_POSTMORTEM_DIR", dir.str()}};
  const auto path = ld::write_rank_postmortem(env_lookup(torchrun), "it failed");
  REQUIRE(path.has_value());
  CHECK(ld::postmortem_from_json_text(read_file(*path)).cause == "it failed");
  CHECK_FALSE(std::filesystem::exists(killed));
  CHECK(std::filesystem::exists(alive));
  CHECK(std::filesystem::exists(elsewhere));
  CHECK(std::filesystem::exists(other_rank));
}

TEST_CASE("post-mortem: a rank answers the asks of its own launch only, not another job's in "
          "the same directory",
          "[postmortem]") {
  // Two mpirun jobs with one LOCKSTEP_POSTMORTEM_DIR: job a's failed rank
  // asks; job b's rank 0, healthy, must not write its part over job a's.
  TempDir dir;
  const std::string part = dir.str() + "/lockstep-postmortem-rank0.json";
  const std::string asked = dir.str() + "/lockstep-postmortem-asked";
  const std::string result = dir.str() + "/result";
  lockstep::collectives::SpawnOptions options;
  options.env = {{"LOCKSTEP_POSTMORTEM_DIR", dir.str()}, {"PMIX_NAMESPACE", "job-b"}};
  lockstep::collectives::spawn(
      1,
      [&](int) {
        auto group = lockstep::collectives::init_process_group();  // its watch starts
        // Asks older than the watch are ignored, by times the file system
        // keeps coarser than the clock's.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::ofstream(asked) << "mpirun job job-a\nrank 1: allreduce #4 failed\n";
        // Longer than the watch's look every second: an answer would be here.
        std::this_thread::sleep_for(std::chrono::milliseconds(3500));
        const bool answered_other_job = std::filesystem::exists(part);
        std::ofstream(asked) << "mpirun job job-b\nrank 1: allreduce #4 failed\n";
        bool answered_own = false;
        for (int i = 0; i < 300 && !answered_own; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          answered_own = std::filesystem::exists(part);
        }
        std::ofstream(result) << answered_other_job << " " << answered_own;
      },
      options);
  std::ifstream in(result);
  int answered_other_job = -1, answered_own = -1;
  in >> answered_other_job >> answered_own;
  CHECK(answered_other_job == 0);
  CHECK(answered_own == 1);
}

TEST_CASE("post-mortem: long group names stay apart, cut between UTF-8 characters",
          "[distributed][postmortem][flight-recorder]") {
  // Two names whose first 31 bytes are the same. Before, the recorder kept
  // those 31 bytes of each, and a post-mortem merged the two groups.
  auto& recorder = ld::FlightRecorder::instance();
  const auto recorded = [&](const std::string& group) {
    recorder.ended(recorder.started({.group = group, .op = "barrier", .seq = 1}), true);
    const auto records = recorder.snapshot();
    REQUIRE_FALSE(records.empty());
    return records.back().group;
  };
  CHECK(recorded("data_parallel_replicas_of_stage_3") == "data_parallel_replicas~9e095867");
  CHECK(recorded("data_parallel_replicas_of_stage_2") == "data_parallel_replicas~d0e22a4d");
  CHECK(recorded("a name of just 31 bytes is kept") == "a name of just 31 bytes is kept");

  // 40 bytes of two-byte characters: 22 bytes of them are kept, then "~"
  // and the hash.
  std::string name;
  for (int i = 0; i < 20; ++i) name += "\xc3\xb1";  // "ñ"
  const std::string short_name = recorded(name);
  CHECK(short_name.size() == 31);
  CHECK(short_name.substr(0, 23) == name.substr(0, 22) + "~");

  TempDir dir;
  const std::map<std::string, std::string> torchrun = {
      {"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCKSTEP_POSTMORTEM_DIR", dir.str()}};
  const auto path = ld::write_rank_postmortem(env_lookup(torchrun), "it failed");
  REQUIRE(path.has_value());
  const ld::Postmortem part = ld::postmortem_from_json_text(read_file(*path));
  REQUIRE(part.ranks.size() == 1);
  REQUIRE_FALSE(part.ranks[0].entries.empty());
  CHECK(part.ranks[0].entries.back().group == short_name);

  // Bytes that are not UTF-8 (a part from elsewhere) are written replaced.
  ld::Postmortem odd{.cause = "bad \xff byte"};
  const ld::Postmortem back = ld::postmortem_from_json_text(ld::to_json_text(odd));
  CHECK(back.cause == "bad \xef\xbf\xbd byte");
}

TEST_CASE("post-mortem: a rank's part says which attempt of a restarted job wrote it",
          "[distributed][postmortem]") {
  TempDir dir;
  const std::map<std::string, std::string> torchrun = {
      {"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RUN_ID", "j7"},
      {"TORCHELASTIC_RESTART_COUNT", "2"}, {"LOCKSTEP_POSTMORTEM_DIR", dir.str()}};
  const auto path = ld::write_rank_postmortem(env_lookup(torchrun), "it failed");
  REQUIRE(path.has_value());
  CHECK(ld::postmortem_from_json_text(read_file(*path)).attempt == "torchrun run j7, restart 2");

  auto mpirun = torchrun;
  mpirun.erase("TORCHELASTIC_RUN_ID");
  mpirun.erase("TORCHELASTIC_RESTART_COUNT");
  REQUIRE(ld::write_rank_postmortem(env_lookup(mpirun), "it failed").has_value());
  CHECK(ld::postmortem_from_json_text(read_file(*path)).attempt.empty());

  // Two mpirun jobs written to one directory: each part names its job, so
  // that --postmortem-from leaves out a part an earlier job left there.
  // Before, both said no attempt, and the earlier job's part of a rank was
  // shown as this job's (that rank called ahead of the ones that failed).
  auto job_a = mpirun, job_b = mpirun;
  job_a["PMIX_NAMESPACE"] = "823656449";
  job_b["PMIX_NAMESPACE"] = "823656450";
  REQUIRE(ld::write_rank_postmortem(env_lookup(job_a), "it failed").has_value());
  const std::string a = ld::postmortem_from_json_text(read_file(*path)).attempt;
  REQUIRE(ld::write_rank_postmortem(env_lookup(job_b), "it failed").has_value());
  const std::string b = ld::postmortem_from_json_text(read_file(*path)).attempt;
  CHECK(a == "mpirun job 823656449");
  CHECK(b == "mpirun job 823656450");
}

TEST_CASE("post-mortem: each mpirun in an sbatch script is a launch of its own and each srun "
          "step one of Slurm's",
          "[distributed][postmortem]") {
  TempDir dir;
  // The batch shell's variables, which every rank mpirun starts there inherits.
  const std::map<std::string, std::string> batch = {
      {"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
      {"LOCKSTEP_POSTMORTEM_DIR", dir.str()}};
  auto job_a = batch;
  job_a.insert({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
                {"PMIX_NAMESPACE", "1874788353"}});
  auto job_b = job_a;
  job_b["PMIX_NAMESPACE"] = "1874395137";
  const auto attempt = [](const std::map<std::string, std::string>& vars) {
    const auto path = ld::write_rank_postmortem(env_lookup(vars), "it failed");
    REQUIRE(path.has_value());
    return ld::postmortem_from_json_text(read_file(*path)).attempt;
  };
  CHECK(attempt(job_a) == "mpirun job 1874788353");
  CHECK(attempt(job_b) == "mpirun job 1874395137");
  // Job a's ranks on a second node have the SLURM_* of the srun step that
  // started mpirun's daemon there, but are of the same launch.
  auto remote = job_a;
  remote.insert({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}});
  remote["SLURM_NTASKS"] = "1";
  CHECK(attempt(remote) == "mpirun job 1874788353");
  // MPICH's mpiexec names no launch: no label, on its node and on the others.
  auto mpiexec = batch;
  mpiexec.insert({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}});
  CHECK(attempt(mpiexec).empty());
  mpiexec.insert({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}});
  CHECK(attempt(mpiexec).empty());
  // srun --mpi=pmix: the namespace is the step's; the step and restart name it.
  auto task = batch;
  task.insert({{"SLURM_STEP_ID", "3"}, {"SLURM_STEP_NUM_TASKS", "1"},
               {"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "slurm.pmix.77.3"}});
  task["SLURM_NTASKS"] = "1";
  CHECK(attempt(task) == "slurm job 77, step 3, restart 0");
}

TEST_CASE("post-mortem: a rank whose newest record was left mid-write is said to have one",
          "[distributed][postmortem][flight-recorder]") {
  // The rank was killed while recording allreduce #2: its entry's version is
  // odd for good. Before, the reader dropped it after a few tries and the
  // rank's last call read as allreduce #1.
  TempDir dir;
  RecorderFile file;
  file.record(1, 4);
  file.record(2, 5);
  const std::string path = dir.str() + "/rank-1";
  file.write(path);

  const auto began = std::chrono::steady_clock::now();
  const auto records = ld::read_flight_recorder_file(path);
  const auto waited = std::chrono::steady_clock::now() - began;
  REQUIRE(records.has_value());
  REQUIRE(records->size() == 2);
  CHECK(records->front().seq == 1);
  CHECK((records->front().group == "default" && records->front().group_size == 4 &&
         records->front().group_rank == 1));
  CHECK(records->back().ordinal == 2);
  CHECK(ld::to_string(records->back().state) == "torn");
  CHECK(waited < std::chrono::seconds(1));  // a few ms: a report is not held up

  // The launcher's reading of it (launcher/postmortem.cpp), as JSON, there
  // and back.
  ld::Postmortem pm{.cause = "rank 1 was killed"};
  pm.ranks.push_back(ld::rank_history(*records, 3'000'000'000, 1, 0, "h", 7));
  const std::string text = ld::to_json_text(ld::postmortem_from_json_text(ld::to_json_text(pm)));
  const auto rank = nlohmann::json::parse(text).at("ranks").at(0);
  CHECK(rank.value("newest_record_torn", false));
  REQUIRE(rank.at("collectives").size() == 1);
  CHECK(rank.at("collectives").at(0).at("seq") == 1);

  // Once the entry is whole it is read as recorded.
  file.record(2, 6);
  file.write(path);
  const auto whole = ld::read_flight_recorder_file(path);
  REQUIRE(whole.has_value());
  REQUIRE(whole->size() == 2);
  CHECK(ld::to_string(whole->back().state) == "finished");
}
