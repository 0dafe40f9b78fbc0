// Checkpoints belong to their run, end to end: fashion_mnist through
// lockstep-run on a 512-sample slice of the real dataset. A new run refuses a
// directory that holds another run's checkpoints (and --restart moves them
// aside); a resume that would change what the run computes is refused with
// every difference named; settings that may change are applied and printed;
// a directory where no checkpoint loads, or that cannot be written, fails
// before any training; under lockstep-run --max-restarts a restarted attempt
// continues only the run its own job saved.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "train/fashion_mnist_runs.h"
#include "runtime/checkpoint/checkpoint_test_util.h"

using namespace lockstep::testing;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// The base options (a quick run), each replaced where `extra` gives it too.
std::vector<std::string> args_with(const std::vector<std::string>& extra) {
  const std::vector<std::pair<std::string, std::string>> base = {
      {"--model", "mlp"},     {"--train-samples", "512"}, {"--test-samples", "1000"},
      {"--batch-size", "64"}, {"--log-every", "1"},       {"--optimizer", "adam"},
      {"--lr-schedule", "step"}};
  std::vector<std::string> args;
  for (const auto& [flag, value] : base) {
    if (std::find(extra.begin(), extra.end(), flag) != extra.end()) continue;
    args.push_back(flag);
    args.push_back(value);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

FashionMnistRun train_ok(int ranks, const std::vector<std::string>& extra) {
  FashionMnistRun run = run_fashion_mnist(ranks, args_with(extra));
  INFO(run.result.output);
  REQUIRE(run.result.ok());
  REQUIRE(!run.digest.empty());
  return run;
}

// A run that must stop before training, with a non-zero exit.
FashionMnistRun refused(int ranks, const std::vector<std::string>& extra) {
  FashionMnistRun run = run_fashion_mnist(ranks, args_with(extra));
  INFO(run.result.output);
  CHECK(run.result.exit_code != 0);
  CHECK_FALSE(run.result.timed_out);
  CHECK_FALSE(run.trained());
  return run;
}

// The checkpoint files under `dir`, by name, with the folder they are in.
std::set<std::string> checkpoint_files(const fs::path& dir, bool recursive) {
  std::set<std::string> out;
  auto add = [&](const fs::directory_entry& e) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors")
      out.insert(fs::relative(e.path(), dir).string());
  };
  if (recursive)
    for (const auto& e : fs::recursive_directory_iterator(dir)) add(e);
  else
    for (const auto& e : fs::directory_iterator(dir)) add(e);
  return out;
}

// A directory that exists but where this process cannot create files, or
// empty when there is none to be had.
std::string unwritable_dir(const std::string& scratch) {
  std::vector<std::string> candidates;
  if (::geteuid() != 0) {
    fs::create_directories(scratch);
    fs::permissions(scratch, fs::perms::owner_read | fs::perms::owner_exec);
    candidates.push_back(scratch);
  } else {
    candidates.push_back("/sys/kernel");  // root ignores permission bits; sysfs refuses files
  }
  for (const auto& dir : candidates) {
    const std::string probe = dir + "/.lockstep-write-probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return dir;
    ::close(fd);
    ::unlink(probe.c_str());
  }
  return {};
}

}  // namespace

TEST_CASE("A new run refuses a directory with another run's checkpoints; --restart moves them aside",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("other-run");
  train_ok(2, {"--epochs", "1", "--checkpoint-dir", dir});
  const auto before = checkpoint_files(dir, false);
  REQUIRE(!before.empty());

  const FashionMnistRun again = refused(2, {"--epochs", "1", "--checkpoint-dir", dir});
  INFO(again.result.output);
  CHECK_THAT(again.result.output, Contains("holds checkpoints of another run") &&
                                      Contains("--resume") && Contains("--restart") &&
                                      Contains(dir));
  CHECK(checkpoint_files(dir, false) == before);  // nothing touched

  const FashionMnistRun restarted = train_ok(2, {"--epochs", "1", "--checkpoint-dir", dir, "--restart"});
  INFO(restarted.result.output);
  CHECK_THAT(restarted.result.output, Contains("moved"));
  // The old files now live, unchanged in name, in one subdirectory; the new
  // run's files are in the directory itself.
  std::set<std::string> moved;
  for (const auto& f : checkpoint_files(dir, true))
    if (fs::path(f).has_parent_path()) moved.insert(fs::path(f).filename().string());
  CHECK(moved == before);
  CHECK_FALSE(checkpoint_files(dir, false).empty());
  fs::remove_all(dir);
}

TEST_CASE("A resume that would change what the run computes is refused, naming each difference",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("changed");
  train_ok(1, {"--epochs", "1", "--checkpoint-dir", dir});
  const auto before = checkpoint_files(dir, false);

  SECTION("the number of ranks alone") {
    const FashionMnistRun r = refused(2, {"--epochs", "2", "--checkpoint-dir", dir, "--resume"});
    INFO(r.result.output);
    CHECK_THAT(r.result.output, Contains("world_size: saved 1, now 2") && Contains("ranks"));
  }
  SECTION("everything that shapes the run") {
    const FashionMnistRun r = refused(
        2, {"--epochs", "2", "--checkpoint-dir", dir, "--resume", "--model", "cnn", "--batch-size",
            "32", "--train-samples", "256", "--test-samples", "500", "--optimizer", "sgd",
            "--lr-schedule", "cosine"});
    INFO(r.result.output);
    for (const char* name : {"world_size", "batch_size", "train_samples", "test_samples", "model",
                             "optimizer", "lr_schedule"})
      CHECK_THAT(r.result.output, Contains(std::string(name) + ": saved"));
  }
  CHECK(checkpoint_files(dir, false) == before);
  fs::remove_all(dir);
}

TEST_CASE("A resume whose --epochs would change the length of the run's schedule is refused, "
          "naming --epochs", "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("epochs-schedule");
  train_ok(1, {"--epochs", "1", "--lr-schedule", "cosine", "--checkpoint-dir", dir});
  const FashionMnistRun r = refused(
      1, {"--epochs", "2", "--lr-schedule", "cosine", "--checkpoint-dir", dir, "--resume"});
  INFO(r.result.output);
  CHECK_THAT(r.result.output, Contains("lr_schedule: saved CosineLR"));
  // The refusal used to name the schedule's t_max alone, never the option that changed it.
  CHECK_THAT(r.result.output, Contains("--epochs 2 (the run was saved with 1)") &&
                                  Contains("Leave --epochs out"));
  // The run goes on as planned without it.
  const FashionMnistRun resumed =
      train_ok(1, {"--lr-schedule", "cosine", "--checkpoint-dir", dir, "--resume"});
  CHECK_THAT(resumed.result.output, Contains("test accuracy"));
  // Another schedule is refused as such, without the note.
  const FashionMnistRun other = refused(
      1, {"--epochs", "2", "--lr-schedule", "step", "--checkpoint-dir", dir, "--resume"});
  CHECK_THAT(other.result.output, Contains("lr_schedule: saved CosineLR"));
  CHECK_THAT(other.result.output, !Contains("Leave --epochs out"));
  fs::remove_all(dir);
}

TEST_CASE("A resume whose --lr would change onecycle's peak rate is refused, naming --lr",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("lr-onecycle");
  train_ok(1, {"--epochs", "1", "--lr-schedule", "onecycle", "--checkpoint-dir", dir});
  const FashionMnistRun r = refused(
      1, {"--lr", "0.01", "--lr-schedule", "onecycle", "--checkpoint-dir", dir, "--resume"});
  INFO(r.result.output);
  CHECK_THAT(r.result.output, Contains("lr_schedule: saved OneCycleLR"));
  CHECK_THAT(r.result.output, Contains("--lr 0.01 (the run was saved with 0.001)") &&
                                  Contains("Leave --lr out"));
  fs::remove_all(dir);
}

TEST_CASE("A resume with the options left out takes the run's saved values and ends where an "
          "uninterrupted run ends",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  // Every option that shapes the run away from its default (the schedule's
  // length does not follow --epochs, so a resume may add an epoch).
  const std::vector<std::string> shaped = {
      "--batch-size", "32",  "--train-samples", "256",    "--test-samples", "300",
      "--optimizer",  "sgd", "--momentum",      "0.5",    "--weight-decay", "0.001",
      "--lr-schedule", "warmup", "--warmup-steps", "5",   "--zero",         "--seed",
      "3",            "--lr", "0.02", "--threads",     "2"};
  std::vector<std::string> straight = shaped;
  straight.insert(straight.end(), {"--epochs", "2"});
  const FashionMnistRun reference = run_fashion_mnist(2, straight);
  INFO(reference.result.output);
  REQUIRE(reference.result.ok());

  const std::string dir = fresh_checkpoint_dir("left-out");
  std::vector<std::string> first = shaped;
  first.insert(first.end(), {"--epochs", "1", "--checkpoint-dir", dir});
  REQUIRE(run_fashion_mnist(2, first).result.ok());
  const FashionMnistRun resumed =
      run_fashion_mnist(2, {"--epochs", "2", "--checkpoint-dir", dir, "--resume"});
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK_THAT(resumed.result.output,
             Contains("256 training and 300 test samples") && Contains("batch 32, sgd lr 0.02") &&
                 Contains("ZeRO, seed 3") && !Contains("replaces the saved 0.02"));
  CHECK(resumed.digest == reference.digest);
  fs::remove_all(dir);
}

TEST_CASE("Settings a resume may change are applied, printed and kept by the run",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("changes");
  const std::string same_lr = dir + "-same-lr";
  fs::remove_all(same_lr);
  train_ok(2, {"--epochs", "1", "--checkpoint-dir", dir});
  fs::copy(dir, same_lr, fs::copy_options::recursive);

  const FashionMnistRun changed =
      train_ok(2, {"--epochs", "2", "--lr", "0.01", "--checkpoint-dir", dir, "--resume"});
  INFO(changed.result.output);
  CHECK_THAT(changed.result.output,
             Contains("lr 0.01 from the command line replaces the saved 0.001") &&
                 Contains("epochs 2 from the command line replaces the saved 1"));
  // Not printed only: the learning rate is what the run then trains with.
  const FashionMnistRun kept = train_ok(2, {"--epochs", "2", "--checkpoint-dir", same_lr, "--resume"});
  INFO(kept.result.output);
  CHECK(kept.result.output.find("replaces the saved 0.001") == std::string::npos);
  CHECK(changed.digest != kept.digest);

  // The run's later checkpoints carry the new values: resuming again without
  // the options continues with them, and nothing is reported as changed.
  const FashionMnistRun later = train_ok(2, {"--checkpoint-dir", dir, "--resume"});
  INFO(later.result.output);
  CHECK(later.result.output.find("replaces the saved") == std::string::npos);
  CHECK(later.digest == changed.digest);  // epochs 2 of 2 done: nothing left to train
  fs::remove_all(dir);
  fs::remove_all(same_lr);
}

TEST_CASE("A resume where no checkpoint loads fails, naming every file and why",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("damaged");
  train_ok(2, {"--epochs", "2", "--checkpoint-every", "2", "--keep-last", "3", "--checkpoint-dir", dir});
  const auto files = checkpoint_files(dir, false);
  REQUIRE(files.size() >= 3);
  int i = 0;
  for (const auto& name : files) {
    const std::string path = (fs::path(dir) / name).string();
    switch (i++ % 3) {
      case 0: fs::resize_file(path, fs::file_size(path) / 2); break;          // cut short
      case 1: flip_bit(path, data_offset_of(path) + 5); break;               // bad checksum
      default: write_bytes(path, "not a checkpoint at all, just some text");  // no header
    }
  }
  const FashionMnistRun r = refused(2, {"--epochs", "2", "--checkpoint-dir", dir, "--resume"});
  INFO(r.result.output);
  CHECK_THAT(r.result.output, Contains("no checkpoint in " + dir + " loads"));
  for (const auto& name : files) CHECK_THAT(r.result.output, Contains(name + ": "));
  CHECK(checkpoint_files(dir, false) == files);  // evidence kept
  fs::remove_all(dir);
}

TEST_CASE("A checkpoint directory that cannot be written fails at start-up",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string scratch = fresh_checkpoint_dir("unwritable");
  SECTION("it exists but takes no files") {
    const std::string dir = unwritable_dir(scratch);
    if (dir.empty()) {
      std::cout << "SKIPPED: no directory here refuses new files to this user" << std::endl;
      return;
    }
    const FashionMnistRun r = refused(2, {"--epochs", "1", "--checkpoint-dir", dir});
    INFO(r.result.output);
    CHECK_THAT(r.result.output, Contains(dir) && Contains("cannot"));
  }
  SECTION("it cannot be created") {
    fs::create_directories(scratch);
    std::ofstream(scratch + "/file") << "a file, not a directory";
    const FashionMnistRun r = refused(2, {"--epochs", "1", "--checkpoint-dir", scratch + "/file/ckpt"});
    INFO(r.result.output);
    CHECK_THAT(r.result.output, Contains(scratch + "/file/ckpt") && Contains("cannot"));
  }
  std::error_code ec;
  fs::permissions(scratch, fs::perms::owner_all, ec);
  fs::remove_all(scratch, ec);
}

namespace {

// lockstep-run -np 1 --max-restarts 1 --restart-backoff 0 [prefix...] fashion_mnist args...
FashionMnistRun restarted_job(const std::vector<std::string>& prefix,
                              const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {bin_path("lockstep-run"), "-np", "1", "--max-restarts", "1",
                                   "--restart-backoff", "0"};
  argv.insert(argv.end(), prefix.begin(), prefix.end());
  argv.push_back(bin_path("fashion_mnist"));
  for (const auto& a : args_with(extra)) argv.push_back(a);
  return parse_fashion_mnist(run_process(argv, std::chrono::seconds(300)));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("Under --max-restarts a new run refused at its start stays refused, never resuming "
          "another run",
          "[optim][checkpoint][resume][restart]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("restart-refused");
  train_ok(1, {"--epochs", "1", "--checkpoint-dir", dir});
  const auto before = checkpoint_files(dir, false);

  // No --resume: the first attempt refuses the directory and exits 1; the
  // restart must refuse it again, not continue the finished run.
  const FashionMnistRun r = restarted_job({}, {"--epochs", "3", "--checkpoint-dir", dir});
  INFO(r.result.output);
  CHECK(r.result.exit_code != 0);
  CHECK_FALSE(r.trained());
  CHECK(count(r.result.output, "already holds checkpoints of another run") == 2);
  CHECK_THAT(r.result.output, Contains("restart 1 of 1") && Contains("giving up") &&
                                  !Contains("resuming the run") && !Contains("resumed from"));
  CHECK(checkpoint_files(dir, true) == before);  // nothing moved, added or deleted
  fs::remove_all(dir);
}

TEST_CASE("Under --max-restarts a --restart whose first attempt died early starts the new run",
          "[optim][checkpoint][resume][restart]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("restart-early");
  train_ok(1, {"--epochs", "1", "--checkpoint-dir", dir});
  const auto before = checkpoint_files(dir, false);

  // The first attempt dies before the program even starts (before rank 0
  // opened the directory); the second is the --restart the user asked for.
  const std::string dies_first =
      "if [ \"$LOCKSTEP_RESTART_COUNT\" = 0 ]; then echo 'attempt 0 dies early'; exit 1; fi; "
      "exec \"$0\" \"$@\"";
  const FashionMnistRun r =
      restarted_job({"/bin/sh", "-c", dies_first}, {"--epochs", "1", "--checkpoint-dir", dir, "--restart"});
  INFO(r.result.output);
  REQUIRE(r.result.ok());
  CHECK_THAT(r.result.output,
             Contains("attempt 0 dies early") &&
                 Contains("restart 1 (LOCKSTEP_RESTART_COUNT): this job saved no checkpoint") &&
                 Contains("moved the") && !Contains("resumed from"));
  CHECK(r.trained());
  std::set<std::string> moved, here;
  for (const auto& f : checkpoint_files(dir, true))
    (fs::path(f).has_parent_path() ? moved : here).insert(fs::path(f).filename().string());
  CHECK(moved == before);
  CHECK_FALSE(here.empty());
  fs::remove_all(dir);
}

TEST_CASE("Under --max-restarts a run whose job saved checkpoints continues them, even with "
          "--restart",
          "[optim][checkpoint][resume][restart]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("restart-own");
  train_ok(1, {"--epochs", "1", "--checkpoint-dir", dir});  // another run, to move aside once

  // The first attempt moves that run aside, trains and saves, and then
  // counts as failed (the wrapper exits 3 after the program). The restart
  // continues this job's run from its newest checkpoint and moves nothing.
  const std::string fails_after =
      "\"$0\" \"$@\"; code=$?; if [ \"$LOCKSTEP_RESTART_COUNT\" = 0 ]; then echo 'attempt 0 "
      "fails after training'; exit 3; fi; exit $code";
  const FashionMnistRun r =
      restarted_job({"/bin/sh", "-c", fails_after}, {"--epochs", "1", "--checkpoint-dir", dir, "--restart"});
  INFO(r.result.output);
  REQUIRE(r.result.ok());
  CHECK(count(r.result.output, "moved the") == 1);
  CHECK_THAT(r.result.output, Contains("attempt 0 fails after training") &&
                                  Contains("restart 1 (LOCKSTEP_RESTART_COUNT): resuming the run") &&
                                  Contains("resumed from"));
  size_t set_aside = 0;
  for (const auto& e : fs::directory_iterator(dir)) set_aside += e.is_directory();
  CHECK(set_aside == 1);
  fs::remove_all(dir);
}
