#include "support/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

extern char** environ;

namespace lockstep::testing {
namespace {

std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    vars[entry.substr(0, entry.find('='))] = entry;
  }
  for (const auto& entry : extra) {
    if (entry.find('=') == std::string::npos)
      vars.erase(entry);  // a bare name: the child runs without it
    else
      vars[entry.substr(0, entry.find('='))] = entry;
  }
  std::vector<std::string> out;
  for (auto& [name, entry] : vars) out.push_back(entry);
  return out;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                          const std::vector<std::string>& env) {
  if (argv.empty()) throw std::invalid_argument("run_process: empty argv");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("run_process: pipe failed");

  const auto envp_strings = merged_environment(env);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : envp_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("run_process: fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    dprintf(STDERR_FILENO, "run_process: cannot execute %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so the group exists before we may kill it
  close(fds[1]);

  ProcessResult result;
  const auto deadline = start + limit;
  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n > 0) {
      result.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;  // every writer closed the pipe
    }
  }
  // Grandchildren may still hold the pipe; the child's group is gone once it
  // is reaped or killed above.
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  close(fds[0]);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

namespace {

// A bash loop that returns once `file` exists, or a later file of its
// directory: one with the same text before the digits and after the last
// dot, whose name sorts after it (checked every 25 ms, for up to `limit`).
// The later file counts because a run keeps only its last few checkpoints
// (ckpt-<zero-padded step>.safetensors: the names sort as the steps do): on a
// loaded machine the run may have saved and deleted `file` between two looks.
// It also returns once the program $pid has ended.
std::string wait_for_file_or_later(const std::string& file, std::chrono::milliseconds limit) {
  const size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : file.substr(0, slash);
  const std::string name = slash == std::string::npos ? file : file.substr(slash + 1);
  const size_t digits = name.find_first_of("0123456789");
  const size_t dot = name.rfind('.');
  const std::string prefix = name.substr(0, digits);
  const std::string extension = dot == std::string::npos ? "" : name.substr(dot);
  return fmt::format(
      "seen() {{ for f in '{}'/'{}'*'{}'; do [ -e \"$f\" ] && "
      "[[ ! \"${{f##*/}}\" < '{}' ]] && return 0; done; return 1; }}; "
      "for i in $(seq {}); do seen && break; kill -0 $pid 2>/dev/null || break; sleep 0.025; "
      "done; ",
      dir, prefix, extension, name, std::max<int64_t>(1, limit.count() / 25));
}

}  // namespace

ProcessResult run_until_file_then_kill(const std::vector<std::string>& argv,
                                       const std::string& file,
                                       std::chrono::milliseconds limit) {
  // pkill -P reaches the launcher's ranks.
  const std::string script = "\"$@\" & pid=$!; " + wait_for_file_or_later(file, limit) +
                             "pkill -KILL -P $pid; kill -KILL $pid; wait $pid; echo exit $?";
  std::vector<std::string> bash = {"/bin/bash", "-c", script, "bash"};
  bash.insert(bash.end(), argv.begin(), argv.end());
  return run_process(bash, limit);
}

ProcessResult run_until_file_then_kill_rank(const std::vector<std::string>& argv,
                                            const std::string& file, const std::string& rank,
                                            std::chrono::milliseconds limit) {
  const std::string script = "\"$@\" & pid=$!; " + wait_for_file_or_later(file, limit) +
                             "pkill -KILL -o -x -P $pid '" + rank + "'; wait $pid; "
                             "echo launcher exit $?";
  std::vector<std::string> bash = {"/bin/bash", "-c", script, "bash"};
  bash.insert(bash.end(), argv.begin(), argv.end());
  return run_process(bash, limit);
}

std::string bin_path(const std::string& name) {
  return fmt::format("{}/bin/{}", LOCKSTEP_BINARY_DIR, name);
}

bool script_skipped(const ProcessResult& result) {
  const auto at = result.output.find("SKIPPED:");
  if (result.exit_code != 0 || at == std::string::npos) return false;
  const auto end = result.output.find('\n', at);
  std::cout << result.output.substr(at, end == std::string::npos ? end : end - at) << std::endl;
  return true;
}

std::string describe(const ProcessResult& result) {
  if (result.timed_out) return fmt::format("timed out after {:.1f} s", result.seconds);
  if (result.signal != 0) return fmt::format("signal {}", sigabbrev_np(result.signal));
  return fmt::format("exit {}", result.exit_code);
}

int unused_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("unused_tcp_port: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("unused_tcp_port: could not bind a loopback port");
  return ntohs(addr.sin_port);
}

namespace {

bool loopback_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int unused_tcp_port_pair() {
  // Below Linux's default ephemeral range (32768-60999); seeded by the pid so
  // tests running side by side start apart.
  const int lo = 20000, span = 12000;
  int port = lo + static_cast<int>(::getpid() * 7919 % span);
  for (int tries = 0; tries < 200; ++tries, port = lo + (port - lo + 2) % span)
    if (loopback_port_free(port) && loopback_port_free(port + 1)) return port;
  throw std::runtime_error("unused_tcp_port_pair: no two free loopback ports found");
}

}  // namespace lockstep::testing
