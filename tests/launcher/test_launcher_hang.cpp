// lockstep-run's hung-rank detection end to end: heartbeats that stop, beats
// that say "no progress", and what must not count as hung (busy ranks, a
// wrapper going on after its program, a rank blocked writing its output).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "launcher/launch_probe.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

using lockstep::testing::bin_path;
using lockstep::testing::check_no_orphans;
using lockstep::testing::describe;
using lockstep::testing::kLimit;
using lockstep::testing::launch;
using lockstep::testing::run_process;
using lockstep::testing::TempDir;
using Catch::Matchers::Contains;

TEST_CASE("launcher: a rank blocked writing to a stalled reader is not hung", "[launcher][hang]") {
  // Both ranks print 2 MB each after joining their group; the launcher's
  // stdout is read only after 4 s, four times the hang timeout.
  const bool tagged = GENERATE(false, true);
  TempDir dir;
  const std::string script = fmt::format(
      "{} -np 2 --hang-timeout 1 {} {} group-sum print-lines=20000 2>{}/err | "
      "{{ sleep 4; wc -l; }}; echo \"launcher exit ${{PIPESTATUS[0]}}\"; cat {}/err",
      bin_path("lockstep-run"), tagged ? "--tag-output" : "", bin_path("launcher_probe"),
      dir.str(), dir.str());
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO("tagged " << tagged << ": " << describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("40002") && Contains("launcher exit 0") && !Contains("is hung"));
}

TEST_CASE("launcher: a hung rank is found within --hang-timeout and named; busy ranks are not",
          "[launcher][hang]") {
  TempDir dir;
  // Stopped (SIGSTOP): its heartbeats stop. The others sleep inside a
  // BusyScope meanwhile, so only rank 1 is named.
  const auto stopped = launch({"-np", "3", "--hang-timeout", "1.5"},
                              {"pid-dir=" + dir.str(), "group-sum", "stop-self=1",
                               "busy-sleep-ms=30000"});
  CHECK(stopped.exit_code == 1);
  CHECK(stopped.seconds < 15);
  CHECK_THAT(stopped.output,
             Contains("rank 1 (local rank 1 on node 0") &&
                 Contains("is hung: it sent no heartbeat for ") &&  // 1.5 s or a little more
                 Contains(" s: it is stopped (SIGSTOP, a debugger) or frozen (--hang-timeout "
                          "1.5 s); killing it and stopping the other 2 ranks") &&
                 !Contains("rank 0 (local") && !Contains("rank 2 (local"));
  check_no_orphans(dir.str(), 3);

  // Blocked for good, using no CPU: its beats say "no progress".
  const auto blocked = launch({"-np", "2", "--hang-timeout", "1.5"},
                              {"group-sum", "block=0", "busy-sleep-ms=30000"});
  CHECK(blocked.exit_code == 1);
  CHECK_THAT(blocked.output, Contains("rank 0 (local rank 0 on node 0") &&
                                 Contains("is hung: it made no progress for ") &&
                                 Contains(" s: it used no CPU and was not waiting for other "
                                          "ranks or reading or writing a file (a deadlock?)"));

  // Computing, or waiting on purpose inside a BusyScope, for twice the
  // timeout is not a hang.
  const auto busy = launch({"-np", "2", "--hang-timeout", "1"},
                           {"group-sum", "spin-ms=2500", "busy-sleep-ms=2500"});
  CHECK(busy.exit_code == 0);
  CHECK_THAT(busy.output, !Contains("is hung"));

  // Under --max-restarts a hang is a failure like any other: restarted.
  const auto restarted = launch({"-np", "2", "--hang-timeout", "1", "--max-restarts", "1",
                                 "--restart-backoff", "0"},
                                {"group-sum", "block=1", "busy-sleep-ms=30000"});
  CHECK(restarted.exit_code == 1);
  CHECK_THAT(restarted.output, Contains("restart 1 of 1") &&
                                   Contains("group-sum rank=1 restart=1 sum=3 ok") &&
                                   Contains("giving up: the ranks failed 2 times"));

  // --hang-timeout 0: no heartbeats asked for.
  const auto off = launch({"-np", "1", "--hang-timeout", "0"},
                          {"print", "show=LOCKSTEP_HEARTBEAT_FD"});
  CHECK(off.exit_code == 0);
  CHECK_THAT(off.output, Contains("LOCKSTEP_HEARTBEAT_FD=(unset)"));
}

TEST_CASE("launcher: a rank waiting for a file's bytes (a slow network share) is not hung",
          "[launcher][hang]") {
  // The rank reads an IDX file from a FIFO whose writer sends it only after
  // 3 s, three times the hang timeout: blocked in a read, using no CPU.
  TempDir dir;
  const std::string fifo = dir.str() + "/slow-idx";
  // u8 elements, one dim of 3, then the 3 bytes.
  const std::string idx = "'\\x00\\x00\\x08\\x01\\x00\\x00\\x00\\x03abc'";
  const std::string script = fmt::format(
      "mkfifo {0} && {{ {{ sleep 3; printf {1}; }} > {0} & }} && "
      "{2} -np 1 --hang-timeout 1 {3} group-sum read-idx={0}; echo \"launcher exit $?\"",
      fifo, idx, bin_path("lockstep-run"), bin_path("launcher_probe"));
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("read-idx rows=3") && Contains("launcher exit 0") &&
                           !Contains("is hung"));
}

TEST_CASE("launcher: a rank's wrapper may go on after its lockstep program exits",
          "[launcher][hang]") {
  // The probe beats, then exits (its last beat says so); its shell goes on
  // for three times the hang timeout, sending no beat.
  const std::string script = bin_path("launcher_probe") + " group-sum; sleep 3";
  const auto r = run_process({bin_path("lockstep-run"), "-np", "2", "--hang-timeout", "1",
                              "/bin/sh", "-c", script},
                             kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("group-sum rank=0 restart=0 sum=3 ok") &&
                           Contains("group-sum rank=1 restart=0 sum=3 ok") &&
                           !Contains("is hung"));
}

TEST_CASE("launcher: a rank waiting in a collective for a stopped peer is not the hung one",
          "[launcher][hang]") {
  // collective_worker --stop-at-rank 1: rank 1 stops after the first barrier
  // and rank 0 waits for it in the next collective, with a collective timeout
  // far beyond the hang timeout.
  const auto r = run_process({bin_path("lockstep-run"), "-np", "2", "--hang-timeout", "2",
                              bin_path("collective_worker"), "--stop-at-rank", "1"},
                             kLimit, {"LOCKSTEP_TIMEOUT_S=600"});
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("rank 1 (local rank 1 on node 0") &&
                           Contains("is hung: it sent no heartbeat") &&
                           !Contains("rank 0 (local rank 0 on node 0"));
}

TEST_CASE("launcher: a rank that runs a collective on its own thread while it waits for a busy "
          "peer is not hung",
          "[launcher][hang]") {
  // Rank 1 sleeps, busy, for three hang timeouts; rank 0 waits for it in an
  // all-reduce, which shm runs on the waiting thread itself.
  const auto r = launch({"-np", "2", "--hang-timeout", "1"},
                        {"group-sum", "busy-sleep-ms=1:3000", "then-allreduce"});
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, !Contains("is hung"));
}

TEST_CASE("launcher: a rank stopped before its first heartbeat is found within --hang-timeout; "
          "one that works long before joining is not hung",
          "[launcher][hang]") {
  // Rank STOP's wrapper stops itself before its program starts, so it never
  // beats; rank 0 waits for it in init_process_group for up to 120 s, far
  // beyond the test's limit: only the hang detector ends the job in time.
  // Rank SLOW's sleeps for three hang timeouts before its program starts.
  TempDir dir;
  const std::string script = dir.str() + "/rank.sh";
  std::ofstream(script) << fmt::format(
      "#!/bin/sh\n"
      "if [ \"$RANK\" = \"$STOP\" ]; then kill -STOP $$; fi\n"
      "if [ \"$RANK\" = \"$SLOW\" ]; then sleep 3; fi\n"
      "exec {} group-sum\n",
      bin_path("launcher_probe"));
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const std::vector<std::string> argv = {bin_path("lockstep-run"), "-np", "2", "--hang-timeout",
                                         "1", "--postmortem-dir", "", script};
  const auto stopped = run_process(argv, kLimit, {"LOCKSTEP_TIMEOUT_S=120", "STOP=1"});
  INFO(describe(stopped) << "\n" << stopped.output);
  CHECK(!stopped.timed_out);
  CHECK(stopped.exit_code == 1);
  CHECK_THAT(stopped.output,
             Contains("rank 1 (local rank 1 on node 0") &&
                 Contains("is hung: it has been stopped (SIGSTOP, a debugger) for ") &&
                 !Contains("rank 0 (local"));

  const auto slow = run_process(argv, kLimit, {"SLOW=0"});
  INFO(describe(slow) << "\n" << slow.output);
  CHECK(slow.exit_code == 0);
  CHECK_THAT(slow.output, Contains("group-sum rank=0 restart=0 sum=3 ok") && !Contains("is hung"));
}
