// A checkpoint writer SIGKILLed in the middle of a write leaves the previous
// checkpoint loadable: the partial data only ever lives in a temporary file.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/subprocess.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
namespace fs = std::filesystem;

namespace {

// The writer as a child process whose stdout we read line by line; killed
// (SIGKILL) and reaped when the test is done with it.
class Writer {
 public:
  explicit Writer(const std::vector<std::string>& argv) {
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~Writer() {
    kill_now();
    close(out_);
  }

  // Reads stdout until `line` appears; false at end of output or after `limit`.
  bool wait_for(const std::string& line, std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (output_.find(line + "\n") == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) return false;
      output_.append(buf, n);
    }
    return true;
  }

  // SIGKILL and reap; returns the signal that ended it (0 if it had exited).
  int kill_now() {
    if (pid_ <= 0) return 0;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }

  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string output_;
};

std::vector<fs::path> temp_files(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_temp_file_name(e.path().filename().string())) out.push_back(e.path());
  return out;
}

void check_previous_survives(const TempDir& tmp, const CheckpointContent& previous) {
  CheckpointDir dir(tmp.str(), {.keep_last = 5, .warn = [](const std::string&) {}});
  REQUIRE(dir.list().size() == 1);
  auto latest = dir.load_latest();
  REQUIRE(latest);
  CHECK(latest->entry.step == 1);
  REQUIRE(latest->content.tensors.size() == previous.tensors.size());
  for (size_t i = 0; i < previous.tensors.size(); ++i)
    CHECK(same_tensor(latest->content.tensors[i].second, previous.tensors[i].second));
  CHECK(temp_files(tmp.str()).empty());  // opening the directory removed the dead writer's file
}

}  // namespace

TEST_CASE("checkpoint: a writer killed mid-write leaves the previous checkpoint", "[checkpoint]") {
  TempDir tmp;
  const CheckpointContent previous = small_content(11);
  CheckpointDir(tmp.str()).save(previous, 1);

  // Slowed down: 64 MB in 4 MB writes, 50 ms apart, killed after the first.
  Writer writer({bin_path("checkpoint_writer"), tmp.str(), "2", "64", "50"});
  REQUIRE(writer.wait_for("writing"));
  const auto partial = temp_files(tmp.str());
  REQUIRE(partial.size() == 1);
  CHECK(fs::file_size(partial[0]) < 64u << 20);
  CHECK(writer.kill_now() == SIGKILL);
  INFO("writer output: " << writer.output());
  CHECK(writer.output().find("done") == std::string::npos);

  check_previous_survives(tmp, previous);
}

TEST_CASE("checkpoint: a writer killed at full speed leaves a loadable checkpoint",
          "[checkpoint]") {
  TempDir tmp;
  const CheckpointContent previous = small_content(12);
  CheckpointDir(tmp.str()).save(previous, 1);

  // 200 MB at full speed, killed as soon as it writes: the kill lands while
  // the data streams out, or (on a very fast disk) after the rename; both are
  // fine, a half-written checkpoint never is.
  Writer writer({bin_path("checkpoint_writer"), tmp.str(), "2", "200"});
  REQUIRE(writer.wait_for("writing"));
  writer.kill_now();

  CheckpointDir dir(tmp.str(), {.warn = [](const std::string&) {}});
  if (fs::exists(dir.path_for_step(2))) {
    CHECK(dir.latest()->step == 2);  // the rename happened: the new file is complete
    return;
  }
  check_previous_survives(tmp, previous);
}
