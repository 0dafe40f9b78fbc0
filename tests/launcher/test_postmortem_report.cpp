// Post-mortems of the collectives: lockstep-run's own, from its ranks'
// flight recorders (one node and two), and the one `lockstep-run
// --postmortem-from` assembles from the parts that ranks started by another
// launcher write themselves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "launcher/launch_probe.h"
#include "lockstep/config.h"
#include "lockstep/distributed/postmortem.h"
#include "support/backend_skip.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::launch;
using lockstep::testing::run_process;
using lockstep::testing::TempDir;
using lockstep::testing::two_local_nodes;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

// The report node `node`'s launcher wrote to `dir` for attempt 0
// (lockstep-postmortem-<job id>-node<N>-attempt0.json); empty if none.
std::string report_path(const std::string& dir, int node) {
  const std::regex name(fmt::format("lockstep-postmortem-[0-9a-f]+-node{}-attempt0\\.json", node));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (std::regex_match(entry.path().filename().string(), name)) return entry.path().string();
  }
  return {};
}

// The report's path as the launcher's output names it; empty if it names none.
std::string named_report(const std::string& output) {
  std::smatch found;
  const std::regex line("every rank's last collectives: (\\S+)");
  return std::regex_search(output, found, line) ? found[1].str() : std::string();
}

// The post-mortem's JSON (launcher/postmortem.h): each rank's last
// collective of the default group as (seq, state).
std::map<int, std::pair<uint64_t, std::string>> last_collectives(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  const auto json = nlohmann::json::parse(in);
  std::map<int, std::pair<uint64_t, std::string>> last;
  for (const auto& r : json.at("ranks")) {
    for (const auto& c : r.at("collectives")) {
      if (c.at("group") == "default" && c.at("seq").get<uint64_t>() > 0)
        last[r.at("rank").get<int>()] = {c.at("seq").get<uint64_t>(), c.at("state")};
    }
  }
  return last;
}

// Three ranks started by a shell (as mpirun or torchrun would start them)
// with LOCKSTEP_POSTMORTEM_DIR=dir: `first` (three all-reduces), then `stuck` (a
// launcher_probe argument that stops rank 1), then a fourth all-reduce, in
// which ranks 0 and 2 wait for rank 1 until their 3 s timeout. Rank 1 is
// killed once they have ended (and, with `answers`, once its part is there
// or 10 s have passed: a loaded machine may take longer than the 2 s the
// others wait); then `lockstep-run --postmortem-from dir`.
lockstep::testing::ProcessResult run_three_ranks_and_report(const std::string& dir,
                                                            const std::string& stuck,
                                                            bool answers = false,
                                                            const std::string& first =
                                                                "group-sum allreduces=3") {
  std::string script = fmt::format("dir={}; ", dir);
  const int port = lockstep::testing::unused_tcp_port();
  for (int r = 0; r < 3; ++r) {
    script += fmt::format(
        "RANK={} WORLD_SIZE=3 LOCAL_RANK={} LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 "
        "MASTER_PORT={} LOCKSTEP_TIMEOUT_S=3 LOCKSTEP_POSTMORTEM_DIR=$dir {} {} {} "
        "then-allreduce > $dir/out{} 2>&1 & p{}=$!; ",
        r, r, port, bin_path("launcher_probe"), first, stuck, r, r);
  }
  script += "wait $p0 $p2; ";
  if (answers)
    script += "for i in $(seq 50); do [ -e $dir/lockstep-postmortem-rank1.json ] && break; "
              "sleep 0.2; done; ";
  script += fmt::format("kill -9 $p1; wait; cat $dir/out*; {} --postmortem-from $dir; echo "
                        "\"report exit $?\"",
                        bin_path("lockstep-run"));
  auto r = run_process({"/bin/bash", "-c", script}, 60s);
  UNSCOPED_INFO("ranks and report: " << describe(r) << ", output:\n" << r.output);
  return r;
}

// The report's first lines: all-reduce #n failed on ranks 0 and 2, which
// wait for rank 1 in it.
void check_rank_1_behind(const std::string& output, uint64_t n) {
  CHECK_THAT(output, Contains(fmt::format("lockstep-run: post-mortem of the collectives "
                                          "(allreduce #{} (f32, 1000 elements) of group "
                                          "'default' failed on ranks 0 and 2):",
                                          n)));
  CHECK_THAT(output, Contains(fmt::format("group 'default': rank 1 is behind: ranks 0 and 2 "
                                          "have reached allreduce #{} (f32, 1000 elements)",
                                          n)));
}

std::string part_path(const TempDir& dir, int rank) {
  return fmt::format("{}/lockstep-postmortem-rank{}.json", dir.str(), rank);
}

// Writes rank's part, as a rank under another launcher would: its last
// collective is allreduce #seq of the default group, ended in `state`.
void write_part(const TempDir& dir, int rank, int world_size, uint64_t seq,
                const std::string& state, const std::string& attempt = "",
                double written_unix_s = 1.8e9) {
  lockstep::distributed::Postmortem pm{
      .cause = state == "failed" ? fmt::format("allreduce #{} of group 'default' failed", seq)
                                 : std::string(),
      .written_unix_s = written_unix_s,
      .world_size = world_size,
      .attempt = attempt};
  pm.ranks.push_back({.rank = rank, .host = "h", .pid = 100 + rank, .recorded = true});
  pm.ranks.back().entries.push_back({.group = "default", .op = "allreduce", .dtype = "f32",
                                     .state = state, .seq = seq, .count = 1000,
                                     .started_s_ago = 2.0, .ended_s_ago = 1.0});
  std::ofstream(part_path(dir, rank)) << lockstep::distributed::to_json_text(pm, 1) << "\n";
}

// Writes rank's part with `entries` (oldest first) as its collectives.
void write_entries(const TempDir& dir, int rank, int world_size,
                   std::vector<lockstep::distributed::PostmortemEntry> entries) {
  lockstep::distributed::Postmortem pm{
      .cause = rank == 0 ? "it failed" : "", .written_unix_s = 1.8e9, .world_size = world_size};
  pm.ranks.push_back({.rank = rank, .host = "h", .pid = 100 + rank, .recorded = true,
                      .entries = std::move(entries)});
  std::ofstream(part_path(dir, rank)) << lockstep::distributed::to_json_text(pm, 1) << "\n";
}

// Allreduce #seq of `group` (of `size` ranks, this one `rank` in it).
lockstep::distributed::PostmortemEntry allreduce_of(const std::string& group, int size, int rank,
                                                    uint64_t seq, const std::string& state) {
  return {.group = group, .op = "allreduce", .dtype = "f32", .group_size = size,
          .group_rank = rank, .state = state, .seq = seq, .count = 1000, .started_s_ago = 2.0,
          .ended_s_ago = state == "running" ? std::nullopt : std::optional<double>(1.0)};
}

// The ranks that the report's lines of `group` name ("ranks 0-2 and 4": 0,
// 1, 2 and 4).
std::set<int> ranks_named(const std::string& report, const std::string& group) {
  const auto begin = report.find("  group '" + group + "': ");
  if (begin == std::string::npos) return {};
  auto end = std::min(report.find("\n  group '", begin + 1),
                      report.find("\n  every rank's", begin + 1));
  const std::string lines = report.substr(begin, end - begin);
  static const std::regex list(R"(ranks? (\d+(?:(?:, |-| and )\d+)*))"), one(R"((\d+)(?:-(\d+))?)");
  std::set<int> named;
  for (std::sregex_iterator m(lines.begin(), lines.end(), list), none; m != none; ++m) {
    const std::string text = (*m)[1];
    for (std::sregex_iterator r(text.begin(), text.end(), one); r != none; ++r) {
      const int first = std::stoi((*r)[1]);
      const int last = (*r)[2].matched ? std::stoi((*r)[2]) : first;
      for (int rank = first; rank <= last; ++rank) named.insert(rank);
    }
  }
  return named;
}

}  // namespace

TEST_CASE("launcher: two jobs' post-mortems in one directory each keep their own file",
          "[launcher][postmortem]") {
  // Before, both were lockstep-postmortem-node0-attempt0.json: the second
  // job's replaced the first's, whose output still named that file.
  TempDir dir;
  const auto first = launch({"-np", "2", "--postmortem-dir", dir.str()},
                            {"group-sum", "allreduces=2", "exit=1:3"});
  const auto second = launch({"-np", "2", "--postmortem-dir", dir.str()},
                             {"group-sum", "allreduces=2", "exit=0:4"});
  INFO(first.output << "\n----\n" << second.output);
  const std::string first_path = named_report(first.output);
  const std::string second_path = named_report(second.output);
  REQUIRE_FALSE(first_path.empty());
  REQUIRE_FALSE(second_path.empty());
  CHECK(first_path != second_path);
  std::ifstream first_in(first_path), second_in(second_path);
  REQUIRE((first_in.good() && second_in.good()));
  CHECK_THAT(nlohmann::json::parse(first_in).at("cause").get<std::string>(),
             Catch::Contains("exited with code 3"));
  CHECK_THAT(nlohmann::json::parse(second_in).at("cause").get<std::string>(),
             Catch::Contains("exited with code 4"));
}

TEST_CASE("launcher: a post-mortem names the rank that is behind and where the others wait",
          "[launcher][postmortem]") {
  TempDir dir;
  // Rank 1 stops after three all-reduces; ranks 0 and 2 wait for it in the
  // fourth until the hang is found.
  const auto hung = launch({"-np", "3", "--hang-timeout", "1.5", "--postmortem-dir", dir.str()},
                           {"group-sum", "allreduces=3", "stop-self=1", "then-allreduce"});
  CHECK(hung.exit_code == 1);
  const std::string json = report_path(dir.str(), 0);
  const auto last = last_collectives(json);
  REQUIRE(last.size() == 3);
  const uint64_t n = last.at(1).first;  // rank 1's last: the third all-reduce
  CHECK(last.at(1) == std::make_pair(n, std::string("finished")));
  CHECK(last.at(0) == std::make_pair(n + 1, std::string("running")));
  CHECK(last.at(2) == std::make_pair(n + 1, std::string("running")));
  CHECK_THAT(hung.output,
             Contains("post-mortem of the collectives (rank 1 (local rank 1 on node 0") &&
                 Contains(fmt::format("group 'default': rank 1 is behind: ranks 0 and 2 have "
                                      "reached, and wait in, allreduce #{} (f32, 1000 elements)",
                                      n + 1)) &&
                 Contains(fmt::format("rank 1: finished allreduce #{} (f32, 1000 elements) ", n)) &&
                 Contains(fmt::format("ranks 0 and 2: in allreduce #{} (f32, 1000 elements) since ",
                                      n + 1)) &&
                 Contains("every rank's last collectives: " + json));

  // A failed rank: the record is read as it was when the rank exited.
  const auto failed = launch({"-np", "2", "--postmortem-dir", dir.str()},
                             {"group-sum", "allreduces=2", "fail-attempts=0:1", "then-allreduce"});
  CHECK(failed.exit_code == 7);
  const auto after_failure = last_collectives(named_report(failed.output));
  REQUIRE(after_failure.size() == 2);
  CHECK(after_failure.at(0).second == "finished");
  CHECK(after_failure.at(1).first == after_failure.at(0).first + 1);
  CHECK_THAT(failed.output, Contains("(rank 0 (local rank 0 on node 0") &&
                                Contains("exited with code 7):") &&
                                Contains("group 'default': rank 0 is behind: rank 1 has reached"));

  // Nothing to say when no rank issued a collective; a job that succeeds
  // has no post-mortem.
  std::filesystem::remove(json);
  const auto early = launch({"-np", "2", "--postmortem-dir", dir.str()}, {"exit=1:3"});
  CHECK(early.exit_code == 3);
  const auto fine = launch({"-np", "2", "--postmortem-dir", dir.str()}, {"group-sum"});
  CHECK(fine.exit_code == 0);
  CHECK_THAT(early.output + fine.output, !Contains("post-mortem"));
  CHECK_FALSE(std::filesystem::exists(json));
}

TEST_CASE("launcher: a post-mortem tells a rank that made its group but issued no collective "
          "from one that never made it", "[launcher][postmortem]") {
  // Rank 1 joins the group and fails before its first collective (as a rank
  // whose data will not load after init_process_group); rank 0 waits in an
  // all-reduce. Before, the flight record began at the first collective, so
  // the report sent the reader to rank 1's start-up: "left no record (it did
  // not get as far as making its process group)".
  TempDir dir;
  const auto r = launch({"-np", "2", "--postmortem-dir", dir.str()},
                        {"join", "fail-attempts=1:1", "then-allreduce"});
  CHECK(r.exit_code == 7);
  CHECK_THAT(r.output, Contains("rank 1: issued no collective on this group") &&
                           !Contains("did not get as far as making its process group"));
}

TEST_CASE("launcher: a post-mortem names the rank stopped inside the collective the others "
          "wait in", "[launcher][postmortem]") {
  // Rank 1 stops inside an all-reduce that ranks 0 and 2 then join; gloo's
  // ring needs every rank to go on, so they wait in it. Before, the report
  // said only that every rank was in it and it did not complete, which reads
  // as the transport's fault.
  LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  TempDir dir;
  const auto r = launch({"-np", "3", "--hang-timeout", "1.5", "--postmortem-dir", dir.str()},
                        {"group-sum", "stop-inside=1"}, {"LOCKSTEP_BACKEND=gloo"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("rank 1 (local rank 1 on node 0") &&
                           Contains("rank 1 is stopped (SIGSTOP, a debugger) in allreduce #") &&
                           Contains("in which ranks 0 and 2 wait for it") &&
                           Contains("; stopped (SIGSTOP, a debugger)\n") &&
                           !Contains("it did not complete"));
  std::ifstream in(report_path(dir.str(), 0));
  const auto json = nlohmann::json::parse(in);
  for (const auto& rank : json.at("ranks"))
    CHECK(rank.value("stopped", false) == (rank.at("rank").get<int>() == 1));
}

TEST_CASE("launcher: the post-mortem of a two-node job covers both nodes' ranks",
          "[launcher][postmortem]") {
  TempDir dir;
  const auto r = two_local_nodes({"--postmortem-dir", dir.str()},
                                 {"group-sum", "allreduces=2", "then-allreduce"},
                                 {"group-sum", "allreduces=2", "fail-attempts=1:1"});
  CHECK_THAT(r.output, Contains("node 1 exit 7") &&
                           Contains("group 'default': rank 1 is behind: rank 0 has reached"));
  // Which failure node 0 hears of first is a race: node 1's report through the
  // store, or its own rank 0's collective failing because rank 1 exited (shm
  // sees that at once). Either way the report holds both nodes' ranks.
  CHECK_THAT(r.output, (Contains("node 0 exit 1\n") &&
                        Contains("post-mortem of the collectives (node 1: rank 1")) ||
                           (Contains("node 0 exit 134") &&
                            Contains("post-mortem of the collectives (rank 0 (local rank 0 on "
                                     "node 0")));
  const auto last = last_collectives(report_path(dir.str(), 0));
  REQUIRE(last.size() == 2);
  CHECK(last.at(0).first == last.at(1).first + 1);
  // Node 1 handed its part to node 0 and wrote none of its own.
  CHECK(report_path(dir.str(), 1).empty());
}

// Under another launcher (a shell here, as mpirun or torchrun would start
// them) nobody reads the recorders: with LOCKSTEP_POSTMORTEM_DIR set, the
// ranks whose collective fails write their own parts, and
// `lockstep-run --postmortem-from` reports them together.
TEST_CASE("launcher: ranks under another launcher write post-mortem parts; --postmortem-from "
          "reports them", "[launcher][postmortem]") {
  TempDir dir;
  // Rank 1 stops itself after three all-reduces; ranks 0 and 2 wait for it
  // in the fourth until their 3 s timeout, and write their parts.
  const auto r = run_three_ranks_and_report(dir.str(), "stop-self=1");
  CHECK(r.ok());
  const auto part = [&](int rank) { return part_path(dir, rank); };
  CHECK(std::filesystem::exists(part(0)));
  CHECK(std::filesystem::exists(part(2)));
  CHECK_FALSE(std::filesystem::exists(part(1)));
  const auto last = last_collectives(part(0));
  REQUIRE(last.count(0) == 1);
  const uint64_t n = last.at(0).first;  // the fourth all-reduce
  CHECK(last.at(0).second == "failed");
  check_rank_1_behind(r.output, n);
  CHECK_THAT(r.output,
             Contains(fmt::format("lockstep: rank 0's last collectives are in {}", part(0))) &&
                 Contains(fmt::format("rank 1: left no record (it wrote no part to {}: it was "
                                      "stopped or killed",
                                      dir.str())) &&
                 Contains(fmt::format("ranks 0 and 2: allreduce #{} (f32, 1000 elements) failed ",
                                      n)) &&
                 Contains("report exit 0"));

  // Under lockstep-run the launcher reads the recorders: no rank writes a part.
  TempDir parts;
  const auto under_launcher =
      launch({"-np", "2", "--postmortem-dir", dir.str()},
             {"group-sum", "allreduces=2", "fail-attempts=0:1", "then-allreduce"},
             {"LOCKSTEP_POSTMORTEM_DIR=" + parts.str()});
  CHECK(under_launcher.exit_code == 7);
  CHECK(std::filesystem::is_empty(parts.str()));
  CHECK_THAT(under_launcher.output, Contains("lockstep-run: post-mortem of the collectives"));

  // A directory without parts is said so.
  const auto empty = run_process({bin_path("lockstep-run"), "--postmortem-from", parts.str()});
  CHECK(empty.exit_code == 1);
  CHECK_THAT(empty.output, Contains("holds no lockstep-postmortem-rank<R>.json"));
}

// A rank stuck in its own code (not stopped: its threads run) answers the
// others' parts with its own, so the report shows where it last was.
TEST_CASE("launcher: under another launcher a rank stuck outside the collectives answers with "
          "its part", "[launcher][postmortem]") {
  TempDir dir;
  // Rank 1 blocks for good after three all-reduces; ranks 0 and 2 wait for
  // it in the fourth until their 3 s timeout.
  const auto r = run_three_ranks_and_report(dir.str(), "block=1", /*answers=*/true);
  CHECK(r.ok());
  const auto part = [&](int rank) { return part_path(dir, rank); };
  for (int rank = 0; rank < 3; ++rank) CHECK(std::filesystem::exists(part(rank)));
  const auto failed = last_collectives(part(0)), answered = last_collectives(part(1));
  REQUIRE(failed.count(0) == 1);
  REQUIRE(answered.count(1) == 1);
  const uint64_t n = failed.at(0).first;  // the fourth all-reduce
  CHECK(failed.at(0).second == "failed");
  CHECK(answered.at(1) == std::make_pair(n - 1, std::string("finished")));
  check_rank_1_behind(r.output, n);
  CHECK_THAT(r.output,
             Contains(fmt::format("lockstep: rank 1's last collectives are in {}", part(1))) &&
                 Contains(fmt::format("rank 1: finished allreduce #{} (f32, 1000 elements) ",
                                      n - 1)) &&
                 Contains("report exit 0"));
}

// The same for a rank that made its group and is stuck before its first
// collective (a data loader after init_process_group that never returns).
// Before, the watch began with the first collective: it wrote no part, and
// the report read "it was stopped or killed, exited first, or does not see
// the directory".
TEST_CASE("launcher: under another launcher a rank stuck before its first collective answers "
          "that it issued none", "[launcher][postmortem]") {
  TempDir dir;
  const auto r = run_three_ranks_and_report(dir.str(), "block=1", /*answers=*/true, "join");
  CHECK(r.ok());
  CHECK(std::filesystem::exists(part_path(dir, 1)));
  CHECK_THAT(r.output, Contains("rank 1: issued no collective on this group") &&
                           !Contains("wrote no part") && Contains("report exit 0"));
}

TEST_CASE("launcher: --postmortem-from says when every rank failed the same collective",
          "[launcher][postmortem]") {
  TempDir dir;
  for (int rank = 0; rank < 3; ++rank) write_part(dir, rank, 3, 4, "failed");
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("group 'default': every rank issued allreduce #4 (f32, 1000 "
                                "elements); it failed on every rank") &&
                           !Contains("ended it differently"));
}

TEST_CASE("launcher: a post-mortem names each rank's call when ranks gave one number to "
          "different collectives", "[launcher][postmortem]") {
  // Rank 0 broadcast the parameters as collective #14 where rank 1 all-reduced
  // a bucket (rank 1 trained one epoch more): the call check failed both.
  TempDir dir;
  write_entries(dir, 0, 2,
                {{.group = "default", .op = "broadcast", .dtype = "f32", .group_size = 2,
                  .group_rank = 0, .state = "failed", .seq = 14, .count = 1863690, .root = 0,
                  .started_s_ago = 2.0, .ended_s_ago = 1.0}});
  write_entries(dir, 1, 2, {allreduce_of("default", 2, 1, 14, "failed")});
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains("group 'default': collective #14 differs across the ranks: rank 0 issued "
                      "broadcast #14 (f32, 1863690 elements, root 0); rank 1 issued allreduce "
                      "#14 (f32, 1000 elements)\n") &&
                 Contains("rank 0: broadcast #14 (f32, 1863690 elements, root 0) failed") &&
                 Contains("rank 1: allreduce #14 (f32, 1000 elements) failed") &&
                 !Contains("every rank issued"));
}

TEST_CASE("launcher: a post-mortem says a rank's newest call is unknown when its record was "
          "left mid-write", "[launcher][postmortem]") {
  TempDir dir;
  write_part(dir, 0, 3, 5, "running");
  write_part(dir, 2, 3, 5, "running");
  // Rank 1 was killed while recording its next call, after allreduce #4.
  write_part(dir, 1, 3, 4, "finished");
  auto json = nlohmann::json::parse(std::ifstream(part_path(dir, 1)));
  json["ranks"][0]["newest_record_torn"] = true;
  std::ofstream(part_path(dir, 1)) << json.dump() << "\n";
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains("group 'default': ranks 0 and 2 have reached, and wait in, allreduce #5 "
                      "(f32, 1000 elements); the newest collective of rank 1 is unknown: its "
                      "record was still being written when read") &&
                 Contains("rank 1: newest collective unknown (its record was still being "
                          "written when read); before it: finished allreduce #4 (f32, 1000 "
                          "elements) 1.0 s ago\n") &&
                 !Contains("is behind"));
}

TEST_CASE("launcher: --postmortem-from reports the other ranks when a part is unreadable",
          "[launcher][postmortem]") {
  // Rank 1 was killed while writing its part (mpirun kills every rank once
  // one exits): the file holds only its start. Before, the whole report was
  // refused over it.
  TempDir dir;
  write_part(dir, 0, 3, 5, "failed");
  write_part(dir, 2, 3, 5, "failed");
  write_part(dir, 1, 3, 4, "finished");
  std::string text;
  {
    std::ifstream in(part_path(dir, 1));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream(part_path(dir, 1), std::ios::trunc) << text.substr(0, text.size() / 2);
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains("ranks 0 and 2: allreduce #5 (f32, 1000 elements) failed") &&
                 Contains(fmt::format("rank 1: left no record (its part {} is unreadable: cut "
                                      "short, or not a post-mortem)",
                                      part_path(dir, 1))) &&
                 !Contains("allreduce #4"));

  // With no part readable, the error names one.
  std::filesystem::remove(part_path(dir, 0));
  std::filesystem::remove(part_path(dir, 2));
  const auto none = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  CHECK(none.exit_code == 1);
  CHECK_THAT(none.output, Contains("no part in " + dir.str() + " can be read: its part"));
}

TEST_CASE("launcher: --postmortem-from refuses a part whose world size or rank is impossible",
          "[launcher][postmortem]") {
  // A damaged (or hostile) part, the newest, says its job had 2^31-1 ranks.
  // Before, the report was made for that many ranks: the launcher ran on
  // without end, growing, and left out the good parts as another job's.
  TempDir dir;
  write_part(dir, 0, 3, 5, "failed");
  write_part(dir, 1, 2147483647, 5, "failed", "", 1.8e9 + 10);
  {
    // And one whose rank is not one of its job's.
    lockstep::distributed::Postmortem pm{.cause = "", .written_unix_s = 1.8e9, .world_size = 3};
    pm.ranks.push_back({.rank = 1000000000, .host = "h", .pid = 7, .recorded = true});
    std::ofstream(part_path(dir, 2)) << lockstep::distributed::to_json_text(pm, 1) << "\n";
  }
  const auto r =
      run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()}, 60s);
  INFO(describe(r));
  REQUIRE(!r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains(fmt::format("{}: its world_size 2147483647 is not a job's size (0 to "
                                  "1048576 ranks): the part is damaged; remove it",
                                  part_path(dir, 1))) &&
                 Contains(fmt::format("{}: it names rank 1000000000, not a rank of its 3-rank "
                                      "job",
                                      part_path(dir, 2))) &&
                 Contains("rank 0: allreduce #5 (f32, 1000 elements) failed") &&
                 Contains(fmt::format("rank 1: left no record (its part {} is damaged)",
                                      part_path(dir, 1))) &&
                 !Contains("rank 3"));
}

TEST_CASE("launcher: --postmortem-from leaves out the parts of an earlier attempt",
          "[launcher][postmortem]") {
  // torchrun restarted the job: in restart 1 ranks 0 and 1 failed in
  // allreduce #4 and rank 2 wrote nothing (killed); its part of restart 0,
  // written a minute before, is still there.
  TempDir dir;
  write_part(dir, 0, 3, 4, "failed", "torchrun run j, restart 1");
  write_part(dir, 1, 3, 4, "failed", "torchrun run j, restart 1");
  write_part(dir, 2, 3, 9, "finished", "torchrun run j, restart 0", 1.8e9 - 60);
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains(fmt::format("left out rank 2's part in {}: of another job or attempt "
                                  "than the last part's (torchrun run j, restart 1)",
                                  dir.str())) &&
                 Contains("rank 2: left no record (it wrote no part to") &&
                 Contains("ranks 0 and 1: allreduce #4 (f32, 1000 elements) failed") &&
                 !Contains("allreduce #9"));
}

TEST_CASE("launcher: --postmortem-from leaves out the parts of a job of another size",
          "[launcher][postmortem]") {
  // A 4-rank job wrote every part; then a 2-rank job, under a launcher that
  // names no job, wrote over ranks 0 and 1. Before, ranks 2 and 3 of the old
  // job were reported as this job's, ahead of ranks 0 and 1.
  TempDir dir;
  for (int rank = 2; rank < 4; ++rank) write_part(dir, rank, 4, 9, "failed", "", 1.8e9 - 600);
  write_part(dir, 0, 2, 4, "failed");
  write_part(dir, 1, 2, 4, "failed");
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains(fmt::format("left out ranks 2 and 3's parts in {}: of a job of another "
                                  "size than the last part's (2 ranks)",
                                  dir.str())) &&
                 Contains("every rank issued allreduce #4 (f32, 1000 elements); it failed on "
                          "every rank") &&
                 !Contains("allreduce #9") && !Contains("ranks 2 and 3:"));
}

TEST_CASE("launcher: the post-mortem of a two-node job names the ranks of a node that sent no "
          "part", "[launcher][postmortem]") {
  TempDir dir;
  // Node 1's rank kills its launcher after two all-reduces: node 0's rank
  // fails in the third, and node 1 never hands over its part.
  const auto r = two_local_nodes({"--postmortem-dir", dir.str(), "--grace-period", "1"},
                                 {"group-sum", "allreduces=2", "then-allreduce"},
                                 {"group-sum", "allreduces=2", "kill-parent=1:9"});
  CHECK_THAT(r.output, Contains("node 1 exit 137") &&
                           Contains("rank 1: left no record (node 1 sent no part of the "
                                    "post-mortem)") &&
                           !Contains("every rank issued"));
  std::ifstream in(report_path(dir.str(), 0));
  REQUIRE(in.good());
  const auto json = nlohmann::json::parse(in);
  REQUIRE(json.at("ranks").size() == 2);
  CHECK(json.at("ranks")[1].at("recorded") == false);
  CHECK(json.at("ranks")[1].at("no_record") == "node 1 sent no part of the post-mortem");
}

#if LOCKSTEP_HAVE_GLOO
TEST_CASE("launcher: the post-mortem of a shm+gloo job names in each member group only its "
          "ranks", "[launcher][postmortem]") {
  // Two nodes of two ranks: the default group is made of 'default.node0'
  // (ranks 0 and 1), 'default.node1' (2 and 3) and 'default.leaders' (0 and
  // 2). Rank 3 fails after two all-reduces. Before, every rank with no record
  // of a member group was said to be behind in it.
  TempDir dir;
  const auto r = two_local_nodes({"--postmortem-dir", dir.str()},
                                 {"group-sum", "allreduces=2", "then-allreduce"},
                                 {"group-sum", "allreduces=2", "fail-attempts=3:1",
                                  "then-allreduce"},
                                 /*nproc_per_node=*/2, /*as_two_machines=*/true);
  CHECK_THAT(r.output, Contains("node 1 exit 7") &&
                           Contains("group 'default': rank 3 is behind: ranks 0-2 have reached"));
  const std::map<std::string, std::set<int>> members = {
      {"default.node0", {0, 1}}, {"default.node1", {2, 3}}, {"default.leaders", {0, 2}}};
  for (const auto& [group, ranks] : members) {
    INFO("group '" << group << "'");
    const std::set<int> named = ranks_named(r.output, group);
    CHECK(named == ranks);
  }
}
#endif  // LOCKSTEP_HAVE_GLOO

TEST_CASE("launcher: a post-mortem leaves the ranks not in a group out of its lines, and says "
          "how many of its ranks it could not place", "[launcher][postmortem]") {
  // Five ranks. 'quad' (4 ranks): ranks 0 and 1 wait in #3, rank 2 finished
  // #2, and its fourth rank issued none of its calls: rank 3 or rank 4.
  // 'pair' (ranks 3 and 4): rank 3 is behind. 'old' is from a part that
  // does not say its groups' sizes: every rank is taken to be in it.
  TempDir dir;
  write_entries(dir, 0, 5, {allreduce_of("quad", 4, 0, 3, "running"),
                            allreduce_of("old", 0, -1, 1, "finished")});
  write_entries(dir, 1, 5, {allreduce_of("quad", 4, 1, 3, "running")});
  write_entries(dir, 2, 5, {allreduce_of("quad", 4, 2, 2, "finished")});
  write_entries(dir, 3, 5, {allreduce_of("pair", 2, 0, 6, "finished")});
  write_entries(dir, 4, 5, {allreduce_of("pair", 2, 1, 7, "running")});
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains("  group 'quad': rank 2 and 1 more of its 4 ranks are behind: ranks 0 and 1 "
                      "have reached, and wait in, allreduce #3 (f32, 1000 elements)\n"
                      "    rank 2: finished allreduce #2 (f32, 1000 elements) 1.0 s ago; nothing "
                      "since\n"
                      "    ranks 0 and 1: in allreduce #3 (f32, 1000 elements) since 2.0 s\n"
                      "    1 more of its 4 ranks: issued none of its collectives or left no record "
                      "(one of ranks 3 and 4, not known which)\n") &&
                 Contains("  group 'pair': rank 3 is behind: rank 4 has reached, and wait in, "
                          "allreduce #7 (f32, 1000 elements)\n"
                          "    rank 3: finished allreduce #6 (f32, 1000 elements) 1.0 s ago; "
                          "nothing since\n"
                          "    rank 4: in allreduce #7 (f32, 1000 elements) since 2.0 s\n") &&
                 Contains("  group 'old': ranks 1-4 are behind: rank 0 has reached allreduce #1"));
  CHECK(ranks_named(r.output, "pair") == std::set<int>{3, 4});
}

TEST_CASE("launcher: a post-mortem shows the send or recv a rank issued after its last "
          "collective", "[launcher][postmortem]") {
  // Rank 0 waits in a recv from rank 1 after all-reduce #5; 'pp' carries
  // only a send and a recv. Before, rank 0 read as having done nothing since
  // #5, every rank as in no collective, and 'pp' was left out.
  TempDir dir;
  const auto p2p = [](const std::string& group, const std::string& op, int size, int rank,
                      int peer, const std::string& state) {
    return lockstep::distributed::PostmortemEntry{
        .group = group, .op = op, .dtype = "f32", .group_size = size, .group_rank = rank,
        .state = state, .count = 10, .root = peer, .started_s_ago = 2.0,
        .ended_s_ago = state == "running" ? std::nullopt : std::optional<double>(1.0)};
  };
  write_entries(dir, 0, 3, {allreduce_of("default", 3, 0, 5, "finished"),
                            p2p("default", "recv", 3, 0, 1, "running"),
                            p2p("pp", "send", 2, 0, 1, "running")});
  write_entries(dir, 1, 3, {allreduce_of("default", 3, 1, 5, "finished"),
                            p2p("pp", "recv", 2, 1, 0, "finished")});
  write_entries(dir, 2, 3, {allreduce_of("default", 3, 2, 5, "finished")});
  const auto r = run_process({bin_path("lockstep-run"), "--postmortem-from", dir.str()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains("  group 'default': every rank finished allreduce #5 (f32, 1000 elements); "
                      "since, rank 0 is in a send or recv of this group\n") &&
                 Contains("    ranks 1 and 2: finished allreduce #5 (f32, 1000 elements) 1.0 s "
                          "ago; nothing since\n") &&
                 Contains("    rank 0: finished allreduce #5 (f32, 1000 elements) 1.0 s ago; "
                          "since: in recv (f32, 10 elements, peer 1) since 2.0 s\n") &&
                 Contains("  group 'pp': only sends and receives, which are not numbered\n") &&
                 Contains("    rank 0: in send (f32, 10 elements, peer 1) since 2.0 s\n") &&
                 Contains("    rank 1: finished recv (f32, 10 elements, peer 0) 1.0 s ago\n"));
}
