// The gpt_train example end to end: its corpus split and errors, and exact
// resume after a SIGKILL (same per-step losses and final parameters as an
// uninterrupted run), at one and two ranks, on a small model.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "lockstep/runtime/checkpoint/safetensors.h"
#include "support/skip.h"
#include "support/subprocess.h"

using namespace lockstep::testing;
namespace fs = std::filesystem;

namespace {

const char* kFortunes = "/usr/share/games/fortunes";

std::string skip_reason() {
  if (!fs::exists(bin_path("gpt_train")))
    return "the gpt_train example is not built (LOCKSTEP_BUILD_EXAMPLES=OFF)";
  return {};
}

std::string fortunes_skip_reason() {
  if (auto r = skip_reason(); !r.empty()) return r;
  if (!fs::exists(fs::path(kFortunes) / "fortunes.dat"))
    return "Debian's fortunes are not installed (apt-get install fortunes)";
  return {};
}

struct GptRun {
  ProcessResult result;
  std::string digest;
  std::map<std::string, std::string> losses;  // "step 5" -> "4.123456"
};

GptRun parse(ProcessResult r) {
  GptRun run{std::move(r), {}, {}};
  std::smatch m;
  if (std::regex_search(run.result.output, m, std::regex("parameters digest: ([0-9a-f]+)")))
    run.digest = m[1];
  const std::regex loss("(step \\d+)/\\d+ loss ([0-9.]+)");
  for (auto it = std::sregex_iterator(run.result.output.begin(), run.result.output.end(), loss);
       it != std::sregex_iterator(); ++it)
    run.losses[(*it)[1]] = (*it)[2];
  return run;
}

std::vector<std::string> command(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  if (ranks > 1) argv = {bin_path("lockstep-run"), "-np", std::to_string(ranks)};
  for (const char* a : {"--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--seq-len", "32",
                        "--batch-size", "4", "--log-every", "1", "--sample-bytes", "0", "--dropout", "0.1"})
    argv.emplace_back(a);
  argv.insert(argv.begin() + (ranks > 1 ? 3 : 0), bin_path("gpt_train"));
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::string scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-gpt-{}-{}", name, ::getpid());
  fs::remove_all(dir);
  return dir.string();
}

// A fortune database: `entries` entries "entry N", with its .dat beside it.
void write_fortunes(const fs::path& file, int first, int entries) {
  std::ofstream out(file);
  for (int i = first; i < first + entries; ++i)
    out << "entry " << i << "\nthe second line of entry " << i << "\n%\n";
  std::ofstream(fs::path(file).concat(".dat")) << "index";
}

}  // namespace

TEST_CASE("gpt_train: every 10th entry is held out; missing data is a clear error",
          "[example][gpt]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path dir = scratch("corpus");
  fs::create_directories(dir);
  write_fortunes(dir / "b", 0, 12);
  write_fortunes(dir / "a", 12, 13);
  std::ofstream(dir / "notes.txt") << "not a database\n%\n";  // no .dat: skipped
  const auto r = run_process(command(1, {"--data", dir.string(), "--steps", "2"}),
                             std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.ok());
  // 25 entries: the 10th and 20th held out.
  CHECK_THAT(r.output, Catch::Contains("2 files; 23 training entries") &&
                           Catch::Contains("2 held out"));

  // A context longer than the text is refused before the model (a billion positions) is built.
  auto long_context = command(1, {"--data", dir.string()});
  *(std::find(long_context.begin(), long_context.end(), "--seq-len") + 1) = "1000000000";
  const auto too_long = run_process(long_context, std::chrono::seconds(60));
  CHECK(too_long.exit_code == 1);
  CHECK_THAT(too_long.output, Catch::Contains("shorter than one window of 1000000001 bytes") &&
                                  !Catch::Contains("model gpt"));

  const auto missing = run_process(command(1, {"--data", (dir / "absent").string()}),
                                   std::chrono::seconds(60));
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.output, Catch::Contains("apt-get install fortunes"));
  fs::remove(dir / "a.dat");
  fs::remove(dir / "b.dat");
  const auto none = run_process(command(1, {"--data", dir.string()}), std::chrono::seconds(60));
  CHECK(none.exit_code == 1);
  CHECK_THAT(none.output, Catch::Contains("holds no fortune database"));
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: a database whose name has a dot is read", "[example][gpt]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path dir = scratch("dotted");
  fs::create_directories(dir);
  // strfile's index of "my.quotes" is "my.quotes.dat"; this directory was
  // refused as holding no database, and such a file beside others was left out.
  write_fortunes(dir / "my.quotes", 0, 25);
  std::ofstream(dir / "my.quotes.u8") << "entry 0\n%\n";  // no index of its own: skipped
  const auto r = run_process(command(1, {"--data", dir.string(), "--steps", "1"}),
                             std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.ok());
  CHECK_THAT(r.output, Catch::Contains("1 files; 23 training entries") &&
                           Catch::Contains("2 held out"));
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: an entry repeated in another file is counted once, in one split",
          "[example][gpt]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path dir = scratch("repeats");
  fs::create_directories(dir);
  write_fortunes(dir / "a", 0, 25);
  // Entries 0..14 again: counted as the 26th to 40th, the 30th would be held
  // out, and entry 4 would be in both splits.
  write_fortunes(dir / "b", 0, 15);
  const auto r = run_process(command(1, {"--data", dir.string(), "--steps", "1"}),
                             std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.ok());
  CHECK_THAT(r.output, Catch::Contains("2 files; 23 training entries") &&
                           Catch::Contains("2 held out"));
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: flags that cannot work are refused before training, naming the rule",
          "[example][gpt]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path dir = scratch("flags");
  fs::create_directories(dir);
  write_fortunes(dir / "a", 0, 25);
  const auto run = [&](std::vector<std::string> args, const char* sample_bytes = "0") {
    args.insert(args.end(), {"--data", dir.string(), "--steps", "2"});
    auto argv = command(1, args);
    *(std::find(argv.begin(), argv.end(), "--sample-bytes") + 1) = sample_bytes;
    return run_process(argv, std::chrono::seconds(120));
  };
  // An empty prompt used to fail only after the whole run, at the sample.
  const auto empty_prompt = run({"--prompt", ""}, "8");
  CHECK(empty_prompt.exit_code == 2);
  CHECK_THAT(empty_prompt.output,
             Catch::Contains("--prompt is empty") && !Catch::Contains("model gpt"));
  CHECK(run({"--prompt", ""}).ok());
  CHECK(run({"--prompt", "entry"}, "8").ok());
  for (const char* lr : {"0", "-1", "inf", "nan", "fast"}) {
    const auto bad = run({"--lr", lr});
    INFO(bad.output);
    CHECK(bad.exit_code != 0);
    CHECK_THAT(bad.output, Catch::Contains(fmt::format("must be a positive number, not {}", lr)));
  }
  // A peak below the cosine's floor: the rate used to climb from --lr to --min-lr.
  const auto below = run({"--lr", "5e-5"});
  CHECK(below.exit_code == 1);
  CHECK_THAT(below.output, Catch::Contains("--min-lr 0.0001 is above --lr 5e-05, the peak "
                                           "learning rate") &&
                               !Catch::Contains("model gpt"));
  CHECK(run({"--lr", "5e-5", "--min-lr", "5e-5"}).ok());
  // More validation windows than the held-out text holds: each is used once.
  const auto windows = run({"--eval-windows", "1000000"});
  INFO(windows.output);
  REQUIRE(windows.ok());
  CHECK_THAT(windows.output, Catch::Contains("note: the held-out text has ") &&
                                 Catch::Contains("--eval-windows 1000000 uses each once"));
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: a diverging run stops at its first NaN loss, naming rank and step",
          "[example][gpt]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  const auto r = run_process(command(1, {"--steps", "20", "--lr", "1e30", "--eval-windows", "1"}),
                             std::chrono::seconds(120));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 0: the loss of step ") &&
                           Catch::Contains("training has diverged") &&
                           !Catch::Contains("step 20/20"));
}

TEST_CASE("gpt_train logs the learning rate each logged step ran at", "[example][gpt]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  // Cosine from 0.01 to 0.001 over 3 steps: 0.01, 0.00775, 0.00325. The log
  // used to show the next step's rate (step 3 showed 0.001, never used).
  const auto r = run_process(command(1, {"--steps", "3", "--warmup-steps", "0", "--lr", "0.01",
                                         "--min-lr", "0.001", "--eval-windows", "1"}),
                             std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto logged = [&](const char* step, const char* lr) {
    const std::string line = fmt::format("step {} loss [0-9.]+ \\([0-9.]+ bits/byte\\) lr {} ",
                                         step, lr);
    return std::regex_search(r.output, std::regex(line));
  };
  CHECK(logged("1/3", "0.01"));
  CHECK(logged("2/3", "0.00775"));
  CHECK(logged("3/3", "0.00325"));
}

TEST_CASE("gpt_train: a run SIGKILLed after a checkpoint resumes exactly", "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  for (int ranks : {1, 2}) {
    DYNAMIC_SECTION(ranks << " rank(s)") {
      // Long enough that the kill lands well before the end.
      const std::vector<std::string> args = {"--steps", "120"};
      // Validation: rarely and small, or after every step and large.
      const auto validating = [](std::vector<std::string> a, bool often) {
        for (const char* v : {"--eval-every", often ? "1" : "100", "--eval-windows", often ? "512" : "8"})
          a.emplace_back(v);
        return a;
      };
      const GptRun straight =
          parse(run_process(command(ranks, validating(args, false)), std::chrono::seconds(300)));
      INFO(straight.result.output);
      REQUIRE(straight.result.ok());
      REQUIRE(!straight.digest.empty());

      const std::string dir = scratch(fmt::format("kill{}", ranks));
      auto with_dir = args;
      for (const std::string a : {"--checkpoint-dir", dir.c_str(), "--checkpoint-every", "4"})
        with_dir.push_back(a);
      // SIGKILL the ranks and the launcher once the step-8 checkpoint exists.
      // A large validation pass after every step (it changes nothing the
      // run computes) keeps this run going long after that.
      const ProcessResult killed = run_until_file_then_kill(
          command(ranks, validating(with_dir, true)), dir + "/ckpt-0000000008.safetensors");
      INFO(killed.output);
      REQUIRE(killed.exit_code == 0);  // bash's own
      CHECK(killed.output.find("parameters digest") == std::string::npos);  // it did not finish

      auto resume_args = validating(with_dir, false);
      resume_args.push_back("--resume");
      const GptRun resumed = parse(run_process(command(ranks, resume_args), std::chrono::seconds(300)));
      INFO(resumed.result.output);
      REQUIRE(resumed.result.ok());
      CHECK_THAT(resumed.result.output, Catch::Contains("resumed from"));
      size_t compared = 0;
      for (const auto& [where, value] : resumed.losses) {
        INFO(where);
        REQUIRE(straight.losses.contains(where));
        CHECK(straight.losses.at(where) == value);
        ++compared;
      }
      CHECK(compared >= 80);
      CHECK(resumed.digest == straight.digest);
      fs::remove_all(dir);
    }
  }
}

TEST_CASE("gpt_train --amp f16 --checkpoint-blocks resumes exactly, the loss scale included",
          "[example][gpt][resume][autocast]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  const std::string dir = scratch("amp");
  const std::vector<std::string> args = {"--steps", "12", "--amp", "f16", "--checkpoint-blocks",
                                         "--eval-every", "100", "--eval-windows", "8",
                                         "--checkpoint-dir", dir, "--checkpoint-every", "4",
                                         "--keep-last", "5"};
  const GptRun straight = parse(run_process(command(1, args), std::chrono::seconds(300)));
  INFO(straight.result.output);
  REQUIRE(straight.result.ok());
  CHECK_THAT(straight.result.output, Catch::Contains("autocast f16, blocks checkpointed"));
  REQUIRE(straight.losses.size() == 12);
  // Back to the step-4 checkpoint, as if the run had died after it.
  for (const char* later : {"ckpt-0000000008.safetensors", "ckpt-0000000012.safetensors"})
    REQUIRE(fs::remove(fs::path(dir) / later));
  // Only the directory and --resume: every option left out, the model's
  // shape, the batch, the schedule's length and --amp included, takes the
  // run's saved value.
  const GptRun resumed =
      parse(run_process({bin_path("gpt_train"), "--checkpoint-dir", dir, "--resume",
                         "--sample-bytes", "0"},
                        std::chrono::seconds(300)));
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK_THAT(resumed.result.output,
             Catch::Contains("step 4") && Catch::Contains("1 layers, 2 heads, width 32") &&
                 Catch::Contains("autocast f16"));
  CHECK(resumed.losses.size() == 8);
  for (const auto& [where, value] : resumed.losses) {
    INFO(where);
    REQUIRE(straight.losses.contains(where));
    CHECK(straight.losses.at(where) == value);
  }
  CHECK(resumed.digest == straight.digest);
  // A resume cannot switch the dtype: it changes what the run computes.
  auto bf16_args = args;
  bf16_args[3] = "bf16";
  bf16_args.push_back("--resume");
  const ProcessResult refused = run_process(command(1, bf16_args), std::chrono::seconds(300));
  CHECK_FALSE(refused.ok());
  CHECK_THAT(refused.output, Catch::Contains("amp"));
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: a data directory whose name is not UTF-8 is recorded and checked on resume",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  // A Latin-1 e-acute: a legal Linux path, but no UTF-8 text; the run used to
  // die at its first checkpoint (nlohmann's type_error 316, naming nothing).
  const fs::path data = scratch("fort\xe9");
  const fs::path utf8_data = scratch("fort\xc3\xa9");
  // Other fortunes under each: the same ones under another path would resume.
  for (const auto& d : {data, utf8_data}) {
    fs::create_directories(d);
    write_fortunes(d / "a", d == data ? 0 : 1, 25);
  }
  const std::string dir = scratch("latin1-ckpt");
  const std::vector<std::string> args = {"--steps", "6", "--eval-every", "100", "--eval-windows",
                                         "1", "--checkpoint-dir", dir, "--checkpoint-every", "3"};
  auto with = [&](const fs::path& d, std::vector<std::string> extra) {
    auto a = args;
    a.insert(a.end(), {"--data", d.string()});
    a.insert(a.end(), extra.begin(), extra.end());
    return command(1, a);
  };
  const GptRun straight = parse(run_process(with(data, {}), std::chrono::seconds(120)));
  INFO(straight.result.output);
  REQUIRE(straight.result.ok());
  CHECK(straight.losses.size() == 6);
  REQUIRE(fs::remove(fs::path(dir) / "ckpt-0000000006.safetensors"));

  const GptRun resumed = parse(run_process(with(data, {"--resume"}), std::chrono::seconds(120)));
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK(resumed.losses.size() == 3);
  CHECK(resumed.digest == straight.digest);

  // The same name in UTF-8 is another directory, with other data: refused, the saved one
  // shown escaped.
  const ProcessResult other = run_process(with(utf8_data, {"--resume"}), std::chrono::seconds(120));
  INFO(other.output);
  CHECK_FALSE(other.ok());
  CHECK_THAT(other.output, Catch::Contains("data: saved " + data.parent_path().string()) &&
                               Catch::Contains("fort\\xe9"));
  for (const auto& d : {data, utf8_data, fs::path(dir)}) fs::remove_all(d);
}

TEST_CASE("gpt_train: a resume on other fortunes under the same --data is refused",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path data = scratch("changing");
  fs::create_directories(data);
  write_fortunes(data / "a", 0, 25);
  const std::string dir = scratch("changing-ckpt");
  const auto args = command(1, {"--steps", "6", "--eval-every", "100", "--eval-windows", "1",
                                "--checkpoint-dir", dir, "--checkpoint-every", "3", "--data",
                                data.string()});
  auto resume = args;
  resume.push_back("--resume");
  const GptRun first = parse(run_process(args, std::chrono::seconds(120)));
  INFO(first.result.output);
  REQUIRE(first.result.ok());
  REQUIRE(fs::remove(fs::path(dir) / "ckpt-0000000006.safetensors"));

  // The package upgraded under the run: as many entries, other text.
  write_fortunes(data / "a", 100, 25);
  const GptRun changed = parse(run_process(resume, std::chrono::seconds(120)));
  INFO(changed.result.output);
  CHECK(changed.result.exit_code == 1);
  CHECK(changed.losses.empty());  // refused before any step
  CHECK_THAT(changed.result.output,
             Catch::Contains("The data under " + data.string() + " is not the data this run "
                             "started with: digest ") &&
                 Catch::Contains("another checkpoint directory"));

  // The original text back: the run continues where it was.
  write_fortunes(data / "a", 0, 25);
  const GptRun resumed = parse(run_process(resume, std::chrono::seconds(120)));
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK(resumed.losses.size() == 3);
  CHECK(resumed.digest == first.digest);
  for (const auto& d : {data, fs::path(dir)}) fs::remove_all(d);
}

TEST_CASE("gpt_train: a resume that restates --n-head alone checks it against the run's width",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path data = scratch("heads-data");
  fs::create_directories(data);
  write_fortunes(data / "a", 0, 25);
  const std::string dir = scratch("heads");
  // Width 48 in 6 heads: the default width, 128, is no multiple of 6.
  auto first = command(1, {"--steps", "2", "--eval-windows", "1", "--checkpoint-dir", dir,
                           "--data", data.string()});
  *(std::find(first.begin(), first.end(), "--n-head") + 1) = "6";
  *(std::find(first.begin(), first.end(), "--n-embd") + 1) = "48";
  const auto trained = run_process(first, std::chrono::seconds(120));
  INFO(trained.output);
  REQUIRE(trained.ok());

  const auto resume = [&](const char* heads) {
    return run_process({bin_path("gpt_train"), "--checkpoint-dir", dir, "--resume", "--n-head",
                        heads, "--sample-bytes", "0"},
                       std::chrono::seconds(120));
  };
  // It was refused as "--n-embd 128 must be a multiple of --n-head 6".
  const auto same = resume("6");
  INFO(same.output);
  CHECK(same.ok());
  CHECK_THAT(same.output, Catch::Contains("resumed from"));
  const auto other = resume("5");
  INFO(other.output);
  CHECK(other.exit_code == 1);
  CHECK_THAT(other.output, Catch::Contains("--n-embd 48 must be a multiple of --n-head 5 (the "
                                           "run's saved value of the one left out)"));
  for (const auto& d : {data, fs::path(dir)}) fs::remove_all(d);
}

TEST_CASE("gpt_train: a resume keeps the run's number of validation windows",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(skip_reason());
  const fs::path data = scratch("windows-data");
  fs::create_directories(data);
  write_fortunes(data / "a", 0, 60);
  const std::string dir = scratch("windows");
  const auto first = parse(run_process(
      command(1, {"--steps", "4", "--eval-every", "2", "--eval-windows", "3", "--checkpoint-dir",
                  dir, "--checkpoint-every", "2", "--data", data.string()}),
      std::chrono::seconds(120)));
  INFO(first.result.output);
  REQUIRE(first.result.ok());
  REQUIRE(fs::remove(fs::path(dir) / "ckpt-0000000004.safetensors"));
  // --resume alone: step 4's validation was over every held-out window (the
  // default 128, cut to what the text holds), not the run's 3, and its best
  // checkpoint compared losses over the two sets.
  const auto resumed = parse(run_process(
      {bin_path("gpt_train"), "--checkpoint-dir", dir, "--resume", "--sample-bytes", "0"},
      std::chrono::seconds(120)));
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  std::smatch was, is;
  const std::regex step4("step 4 validation [0-9.]+");
  REQUIRE(std::regex_search(first.result.output, was, step4));
  REQUIRE(std::regex_search(resumed.result.output, is, step4));
  CHECK(was.str() == is.str());
  CHECK(resumed.digest == first.digest);
  for (const auto& d : {data, fs::path(dir)}) fs::remove_all(d);
}

TEST_CASE("gpt_train: a run resumed inside a --log-every window logs the losses an "
          "uninterrupted one does", "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  const std::string dir = scratch("log-window");
  auto args = command(1, {"--steps", "10", "--eval-every", "100", "--eval-windows", "8",
                          "--checkpoint-dir", dir, "--checkpoint-every", "3", "--keep-last", "5"});
  *(std::find(args.begin(), args.end(), "--log-every") + 1) = "4";
  const GptRun straight = parse(run_process(args, std::chrono::seconds(300)));
  INFO(straight.result.output);
  REQUIRE(straight.result.ok());
  REQUIRE(straight.losses.size() == 3);  // steps 4, 8 and 10
  // Back to the step-6 checkpoint: halfway through the window logged at step 8.
  for (const char* later : {"ckpt-0000000009.safetensors", "ckpt-0000000010.safetensors"})
    REQUIRE(fs::remove(fs::path(dir) / later));
  args.push_back("--resume");
  const GptRun resumed = parse(run_process(args, std::chrono::seconds(300)));
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK_THAT(resumed.result.output, Catch::Contains("resumed from"));
  // Step 8's line is the mean of steps 5 to 8, two of them before the resume;
  // it used to average steps 7 and 8 alone.
  REQUIRE(resumed.losses.size() == 2);
  for (const char* where : {"step 8", "step 10"}) {
    INFO(where);
    REQUIRE(resumed.losses.contains(where));
    CHECK(resumed.losses.at(where) == straight.losses.at(where));
  }
  CHECK(resumed.digest == straight.digest);
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: a resume that leaves out --checkpoint-blocks keeps the run's",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  const std::string dir = scratch("blocks");
  const auto args = command(1, {"--steps", "6", "--checkpoint-blocks", "--eval-every", "100",
                                "--eval-windows", "8", "--checkpoint-dir", dir,
                                "--checkpoint-every", "3", "--keep-last", "5"});
  const GptRun straight = parse(run_process(args, std::chrono::seconds(300)));
  INFO(straight.result.output);
  REQUIRE(straight.result.ok());
  CHECK_THAT(straight.result.output, Catch::Contains("blocks checkpointed"));
  const auto resume = [&](std::vector<std::string> extra) {
    REQUIRE(fs::remove(fs::path(dir) / "ckpt-0000000006.safetensors"));
    std::vector<std::string> argv = {bin_path("gpt_train"), "--checkpoint-dir", dir, "--resume",
                                     "--sample-bytes", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return parse(run_process(argv, std::chrono::seconds(300)));
  };
  // The memory the run was started to fit in: a resume of a model that fits
  // only so used to drop it, as --checkpoint-blocks was not recorded.
  const GptRun kept = resume({});
  INFO(kept.result.output);
  REQUIRE(kept.result.ok());
  CHECK_THAT(kept.result.output, Catch::Contains("blocks checkpointed"));
  CHECK(kept.digest == straight.digest);
  // Turned off on purpose: said, and the run goes on exactly all the same.
  const GptRun off = resume({"--no-checkpoint-blocks"});
  INFO(off.result.output);
  REQUIRE(off.result.ok());
  CHECK_THAT(off.result.output,
             Catch::Contains("checkpoint_blocks off from the command line replaces the saved on") &&
                 !Catch::Contains("blocks checkpointed"));
  CHECK(off.digest == straight.digest);
  fs::remove_all(dir);
}

TEST_CASE("gpt_train logs the loss of the global batch: two ranks of 2 log what one process "
          "of 4 does", "[example][gpt]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  // Rank k's rows of a step are rows k * 2, k * 2 + 1 of the step's global
  // draw: the same batches as one process of 4, so the same training.
  const auto run = [](int ranks, const char* batch) {
    auto args = command(ranks, {"--steps", "4", "--eval-every", "100", "--eval-windows", "8"});
    *(std::find(args.begin(), args.end(), "--batch-size") + 1) = batch;
    *(std::find(args.begin(), args.end(), "--dropout") + 1) = "0";
    return parse(run_process(args, std::chrono::seconds(300)));
  };
  const GptRun one = run(1, "4");
  INFO(one.result.output);
  REQUIRE(one.result.ok());
  const GptRun two = run(2, "2");
  INFO(two.result.output);
  REQUIRE(two.result.ok());
  REQUIRE(one.losses.size() == 4);
  REQUIRE(two.losses.size() == one.losses.size());
  // Rank 0 used to log the loss of its own two rows.
  for (const auto& [step, loss] : one.losses) {
    INFO(step);
    CHECK(std::stod(two.losses.at(step)) == Approx(std::stod(loss)).margin(1e-4));
  }
}

TEST_CASE("gpt_train: each rank draws its own dropout masks, as nanoGPT's seed + rank",
          "[example][gpt]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  // The default generator serves dropout alone (initialisation, batches and
  // the sample have their own): seeded alike on every rank, the ranks dropped
  // the same units at the same positions of their batches each step.
  const std::string dir = scratch("dropout-streams");
  const auto r = run_process(command(2, {"--steps", "1", "--eval-windows", "2",
                                         "--checkpoint-dir", dir, "--seed", "5"}),
                             std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE(r.ok());
  const auto meta =
      lockstep::runtime::read_safetensors(dir + "/ckpt-0000000001.safetensors").metadata;
  REQUIRE(meta.at("rng.ranks") == "2");
  CHECK(meta.at("rng.0.seed") == "5");  // rank 0 keeps the run's seed
  CHECK(meta.at("rng.0.rank.1.seed") != meta.at("rng.0.seed"));
  CHECK(meta.at("rng.0.offset") == meta.at("rng.0.rank.1.offset"));  // as many draws
  fs::remove_all(dir);
}

TEST_CASE("gpt_train: a resumed run's elapsed time goes on from its checkpoint's",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  // A resume used to print the time since its own start: the run's first part
  // was forgotten, in the log and in every later checkpoint.
  const std::string dir = scratch("elapsed");
  const std::vector<std::string> args = {"--steps", "4", "--eval-windows", "2",
                                         "--checkpoint-dir", dir, "--checkpoint-every", "2",
                                         "--keep-last", "5"};
  const auto first = run_process(command(1, args), std::chrono::seconds(300));
  INFO(first.output);
  REQUIRE(first.ok());
  REQUIRE(fs::remove(fs::path(dir) / "ckpt-0000000004.safetensors"));
  // As if the run's first two steps had taken 5000 s.
  const std::string step2 = dir + "/ckpt-0000000002.safetensors";
  auto file = lockstep::runtime::read_safetensors(step2);
  file.metadata.erase(lockstep::runtime::kChecksumKey);
  file.metadata.erase(lockstep::runtime::kTensorChecksumsKey);
  file.metadata["user.elapsed_s"] = "5000";
  lockstep::runtime::write_safetensors(step2, file.tensors, file.metadata);

  auto resume_args = args;
  resume_args.push_back("--resume");
  const auto resumed = run_process(command(1, resume_args), std::chrono::seconds(300));
  INFO(resumed.output);
  REQUIRE(resumed.ok());
  std::smatch m;
  REQUIRE(std::regex_search(resumed.output, m, std::regex("step 3/4 loss .* elapsed (\\d+)s")));
  CHECK(std::stod(m[1]) >= 5000);
  const auto saved =
      lockstep::runtime::read_safetensors(dir + "/ckpt-0000000004.safetensors").metadata;
  CHECK(std::stod(saved.at("user.elapsed_s")) >= 5000);
  fs::remove_all(dir);
}

TEST_CASE("gpt_train --no-bias trains a model without biases, which a resume keeps",
          "[example][gpt][resume]") {
  LOCKSTEP_SKIP_IF(fortunes_skip_reason());
  const std::string dir = scratch("no-bias");
  const auto args = command(1, {"--steps", "4", "--no-bias", "--eval-every", "100",
                                "--eval-windows", "2", "--checkpoint-dir", dir,
                                "--checkpoint-every", "2", "--keep-last", "5"});
  const GptRun straight = parse(run_process(args, std::chrono::seconds(300)));
  INFO(straight.result.output);
  REQUIRE(straight.result.ok());
  // nanoGPT's bias=False: no Linear or LayerNorm bias in the saved model.
  const auto file = lockstep::runtime::read_safetensors(
      (fs::path(dir) / "ckpt-0000000004.safetensors").string());
  int biases = 0, weights = 0;
  for (const auto& [name, t] : file.tensors) {
    if (name.starts_with("model.") && name.ends_with(".bias")) ++biases;
    if (name.starts_with("model.") && name.ends_with(".weight")) ++weights;
  }
  CHECK(biases == 0);
  CHECK(weights > 0);
  // A resume that leaves the flag out keeps the run's model; one that asks for
  // biases is refused, naming both models.
  REQUIRE(fs::remove(fs::path(dir) / "ckpt-0000000004.safetensors"));
  const std::vector<std::string> resume = {bin_path("gpt_train"), "--checkpoint-dir", dir,
                                           "--resume", "--sample-bytes", "0"};
  const GptRun resumed = parse(run_process(resume, std::chrono::seconds(300)));
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK(resumed.digest == straight.digest);
  auto with_bias = resume;
  with_bias.push_back("--bias");
  const auto refused = run_process(with_bias, std::chrono::seconds(300));
  CHECK_FALSE(refused.ok());
  CHECK_THAT(refused.output, Catch::Contains("bias=off, now gpt"));
  fs::remove_all(dir);
}
