// The flight recorder (distributed/flight_recorder.h): every collective a group
// issues is recorded with its number, op, dtype and count, and ended as it
// ended; the newest kFlightRecorderEntries stay.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/work.h"
#include "lockstep/distributed/flight_recorder.h"
#include "support/backend_skip.h"
#include "support/subprocess.h"

namespace lt = lockstep::testing;
using lockstep::distributed::FlightRecord;
using lockstep::distributed::FlightRecorder;
using lockstep::runtime::Tensor;

namespace {

std::vector<FlightRecord> records_of(const std::string& group) {
  std::vector<FlightRecord> out;
  for (auto& r : FlightRecorder::instance().snapshot())
    if (r.group == group) out.push_back(r);
  return out;
}

}  // namespace

TEST_CASE("flight recorder: each collective with its number, op, dtype, count and end",
          "[collectives][flight-recorder]") {
  const auto groups = lt::make_groups("shm", 2, "recorded");
  const auto errors = lt::run_ranks(2, [&](int r) {
    Tensor x = Tensor::full({10}, 1.0);
    groups[r]->allreduce(x)->wait();
    Tensor y = Tensor::zeros({3}, lockstep::runtime::DType::i64);
    groups[r]->broadcast(y, {.root = 1})->wait();
    groups[r]->barrier()->wait();
  });
  for (const auto& e : errors) REQUIRE(lt::message_of(e) == "<no exception>");

  const auto records = records_of("recorded");
  REQUIRE(records.size() == 6);  // two ranks, three calls each
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    std::vector<FlightRecord> calls;
    std::copy_if(records.begin(), records.end(), std::back_inserter(calls),
                 [&](const FlightRecord& r) { return r.seq == seq; });
    REQUIRE(calls.size() == 2);
    for (const auto& c : calls) {
      INFO("call #" << seq << ": " << c.op);
      CHECK(c.state == FlightRecord::State::finished);
      CHECK(c.end_ns >= c.start_ns);
      CHECK(c.start_ns > 0);
      CHECK((c.group_size == 2 && c.group_rank >= 0 && c.group_rank < 2));
      if (seq == 1) CHECK((c.op == "allreduce" && c.dtype == "f32" && c.count == 10 && c.root == -1));
      if (seq == 2) CHECK((c.op == "broadcast" && c.dtype == "i64" && c.count == 3 && c.root == 1));
      if (seq == 3) CHECK((c.op == "barrier" && c.dtype.empty() && c.count == 0));
    }
  }
}

TEST_CASE("flight recorder: a wrapper group's call is recorded once, by the group it wraps",
          "[collectives][flight-recorder]") {
  // LOCKSTEP_DEBUG=detail's checker wraps the backend's group, as CUDA
  // staging does in CUDA builds.
  const auto groups = lt::make_groups("shm", 2, "recorded-once", std::chrono::seconds(60),
                                      lockstep::distributed::DebugLevel::Detail);
  const auto errors = lt::run_ranks(2, [&](int r) {
    Tensor x = Tensor::full({5}, 1.0);
    groups[r]->allreduce(x)->wait();
  });
  for (const auto& e : errors) REQUIRE(lt::message_of(e) == "<no exception>");
  const auto records = records_of("recorded-once");
  REQUIRE(records.size() == 2);  // one per rank
  for (const auto& r : records) {
    CHECK(r.seq == 1);
    CHECK(r.state == FlightRecord::State::finished);
  }
}

TEST_CASE("flight recorder: a collective that timed out is recorded as failed",
          "[collectives][flight-recorder]") {
  const auto groups = lt::make_groups("shm", 2, "recorded-timeout", std::chrono::milliseconds(300));
  Tensor x = Tensor::full({4}, 1.0);
  auto work = groups[0]->allreduce(x);  // rank 1 never joins
  auto running = records_of("recorded-timeout");
  REQUIRE(running.size() == 1);
  CHECK(running[0].state == FlightRecord::State::running);
  CHECK(running[0].end_ns == 0);
  CHECK_THROWS_AS(work->wait(), lockstep::collectives::CollectiveError);
  const auto failed = records_of("recorded-timeout");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].state == FlightRecord::State::failed);
  CHECK(failed[0].end_ns >= failed[0].start_ns);
}

TEST_CASE("flight recorder: the newest entries stay, oldest first", "[collectives][flight-recorder]") {
  const auto groups = lt::make_groups("shm", 1, "recorded-many");
  const int n = lockstep::distributed::kFlightRecorderEntries + 44;
  Tensor x = Tensor::full({1}, 1.0);
  for (int i = 0; i < n; ++i) groups[0]->allreduce(x)->wait();
  const auto all = FlightRecorder::instance().snapshot();
  REQUIRE(all.size() == static_cast<size_t>(lockstep::distributed::kFlightRecorderEntries));
  for (size_t i = 1; i < all.size(); ++i) CHECK(all[i].ordinal == all[i - 1].ordinal + 1);
  CHECK(all.back().group == "recorded-many");
  CHECK(all.back().seq == static_cast<uint64_t>(n));
}

TEST_CASE("flight recorder: another process's file is read, or refused when it is not one",
          "[collectives][flight-recorder]") {
  CHECK_FALSE(lockstep::distributed::read_flight_recorder_file("/nonexistent/rank-0").has_value());
  const auto path = std::filesystem::temp_directory_path() / "lockstep-not-a-recorder";
  std::ofstream(path) << "hello";
  CHECK_THROWS_WITH(lockstep::distributed::read_flight_recorder_file(path.string()),
                    Catch::Contains("is not a flight recorder file"));
  std::filesystem::remove(path);
}

TEST_CASE("flight recorder: a rank whose recorder file finds its file system full records in "
          "memory and runs on",
          "[collectives][flight-recorder]") {
  // A full /dev/shm (where lockstep-run puts the files) as another job can
  // leave it: a 512 KiB tmpfs, filled, in a mount namespace of the script's
  // own (root only).
  const auto dir = std::filesystem::temp_directory_path() /
                   ("lockstep-full-tmpfs-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  // $0: the mount point; $1: the rank program.
  const std::string full_tmpfs = R"(mount -t tmpfs -o size=512k tmpfs "$0" || exit 1
dd if=/dev/zero of="$0/fill" bs=4k 2>/dev/null
LOCKSTEP_FLIGHT_RECORDER="$0/rank-0" exec "$1" group-sum)";
  const std::string script = fmt::format(
      "unshare -m true 2>/dev/null || {{ echo 'SKIPPED: cannot unshare a mount namespace (needs "
      "root)'; exit 0; }}; exec unshare -m sh -c '{}' '{}' '{}'",
      full_tmpfs, dir.string(), lt::bin_path("launcher_probe"));
  const auto result = lt::run_process({"/bin/sh", "-c", script});
  std::filesystem::remove_all(dir);
  if (lt::script_skipped(result)) return;
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  CHECK_THAT(result.output, Catch::Contains("group-sum rank=0 restart=0 sum=1 ok"));
  CHECK_THAT(result.output, Catch::Contains("could not be made (No space left on device)"));
}

TEST_CASE("flight recorder: a send and recv that a group hands to another end in both groups",
          "[collectives][flight-recorder]") {
  // shm sends point to point through a gloo group of its own, shm+gloo
  // through its gloo group of all ranks: each records the call.
  LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  const std::string backend = GENERATE("shm", "shm+gloo");
  INFO(backend);
  const std::string name = "recorded-p2p-" + backend;
  const auto groups = lt::make_groups(backend, 2, name);
  const auto errors = lt::run_ranks(2, [&](int r) {
    Tensor t = Tensor::ones({4});
    // The recv is posted before the send, so it is still running when the
    // outer group records it.
    if (r == 1) groups[1]->recv(t, 0)->wait();
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      groups[0]->send(t, 1)->wait();
    }
  });
  for (const auto& e : errors) REQUIRE(lt::message_of(e) == "<no exception>");
  int recorded = 0;
  for (const auto& r : FlightRecorder::instance().snapshot()) {
    if (r.group.rfind(name, 0) != 0) continue;
    ++recorded;
    INFO(r.group << ": " << r.op << " on rank " << r.group_rank);
    CHECK(r.state == FlightRecord::State::finished);
    CHECK(r.end_ns >= r.start_ns);
  }
  CHECK(recorded == 4);  // the send and the recv, each in both groups
}
