#include "launcher/spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::launcher {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

void write_str(int fd, const char* text) {
  const ssize_t ignored = write(fd, text, strlen(text));
  (void)ignored;
}

// Whether a file the kernel will not run (ENOEXEC) may be a script without
// "#!", for /bin/sh to run as execvp and shells do. Not when it reads as
// binary, as bash decides: an ELF header (a program for another
// architecture), or a NUL byte in its first line (up to 80 bytes). /bin/sh
// would read such a file as commands, and print garbage.
bool may_be_script(const std::string& program) {
  char head[80] = {};
  const int fd = open(program.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // execute-only: /bin/sh could not read it either
  const ssize_t n = read(fd, head, sizeof head);
  close(fd);
  if (n < 0) return false;
  const std::string_view text(head, static_cast<size_t>(n));
  if (text.substr(0, 4) == "\x7f" "ELF") return false;
  return text.substr(0, text.find('\n')).find('\0') == std::string_view::npos;
}

// The interpreter `program`'s "#!" line names, as the kernel reads it: the
// first word after "#!" in the file's first 256 bytes (BINPRM_BUF_SIZE).
// nullopt when there is none, or the file cannot be read (execute-only: the
// kernel may still run it).
std::optional<std::string> interpreter_of(const std::string& program) {
  char head[256] = {};
  const int fd = open(program.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const ssize_t n = read(fd, head, sizeof head);
  close(fd);
  if (n < 2 || head[0] != '#' || head[1] != '!') return std::nullopt;
  const std::string_view line(head + 2, static_cast<size_t>(n) - 2);
  const auto start = line.find_first_not_of(" \t");
  if (start == std::string_view::npos || line[start] == '\n') return std::nullopt;
  return std::string(line.substr(start, line.find_first_of(" \t\n", start) - start));
}

// Runs in the forked child: only async-signal-safe calls until execve.
// `as_script` is {"/bin/sh", program, argv[1:]...}: execvp's fallback for a
// program the kernel does not know how to run (a script without "#!"), or
// null when the file is not one (may_be_script); then `not_runnable` says so.
[[noreturn]] void exec_child(pid_t launcher, const char* program, char* const* argv,
                             char* const* as_script, const char* not_runnable,
                             char* const* envp, int out_fd, int err_fd, int heartbeat_fd,
                             const cpu_set_t* cpus) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);  // the launcher died before prctl
  const int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
  if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
  int first_closed = 3;
  if (heartbeat_fd >= 0) {
    // dup2 clears close-on-exec; onto itself it would not.
    if (heartbeat_fd == kChildHeartbeatFd) fcntl(heartbeat_fd, F_SETFD, 0);
    else dup2(heartbeat_fd, kChildHeartbeatFd);
    first_closed = kChildHeartbeatFd + 1;
  }
  // Nothing else of the launcher's (store sockets, other ranks' pipes) leaks.
  close_range(static_cast<unsigned>(first_closed), ~0U, 0);
  // Every signal at its default: an ignored signal stays ignored through exec,
  // and the launcher ignores SIGPIPE itself and may have been started with
  // SIGINT and SIGQUIT ignored (`lockstep-run ... &` in a script), which would
  // make the ranks shrug off the SIGINT it forwards. (Glibc's internal
  // signals refuse the call; that is fine.)
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  int error = 0;
  if (cpus != nullptr && sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0) {
    error = errno;
    write_str(STDERR_FILENO, "lockstep-run: --bind-to core: cannot bind the rank running ");
  } else {
    execve(program, argv, envp);
    if (errno == ENOEXEC && as_script == nullptr) {
      write_str(STDERR_FILENO, not_runnable);
      _exit(126);
    }
    if (errno == ENOEXEC) execve(as_script[0], as_script, envp);
    error = errno;
    write_str(STDERR_FILENO, "lockstep-run: cannot execute ");
  }
  write_str(STDERR_FILENO, program);
  write_str(STDERR_FILENO, ": ");
  const char* desc = strerrordesc_np(error);
  write_str(STDERR_FILENO, desc != nullptr ? desc : "unknown error");
  write_str(STDERR_FILENO, "\n");
  // As shells and mpirun: 127 when there is no such program, 126 when it is
  // there but cannot run (not executable, a directory, a bad format, busy).
  _exit(error == ENOENT || error == ENOTDIR ? 127 : 126);
}

}  // namespace

std::optional<std::string> find_program(const std::string& name, const std::string& path) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    if (is_executable_file(name)) return name;
    return std::nullopt;
  }
  std::string_view rest = path;
  for (;;) {
    const auto colon = rest.find(':');
    // An empty PATH entry means the current directory.
    const std::string_view dir = colon == 0 || rest.empty() ? std::string_view(".") : rest.substr(0, colon);
    const std::string candidate = std::string(dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

// A Python script is run as `python3 train.py`, as torchrun runs it: made
// executable without a "#!" line, /bin/sh runs its lines as commands.
bool is_python_script(const std::string& name) {
  return name.size() > 3 && name.ends_with(".py");
}

std::string run_python_instead(const std::string& name) {
  return fmt::format("; run it with Python, as torchrun does (lockstep-run -np N python3 {}), or "
                     "give it a #! line (#!/usr/bin/env python3) and chmod +x it",
                     name);
}

std::string why_not_found(const std::string& name) {
  struct stat st {};
  if (name.find('/') != std::string::npos) {
    if (stat(name.c_str(), &st) != 0) return "not found";
    if (S_ISDIR(st.st_mode)) return "is a directory";
    if (!S_ISREG(st.st_mode)) return "is not a regular file";
    if (is_python_script(name)) return "is not executable" + run_python_instead(name);
    return "is not executable (chmod +x it)";
  }
  // A program in the current directory is not searched for (as with execvp
  // and mpirun): its path must be given.
  const std::string here = "./" + name;
  std::string why = "not found in PATH";
  if (stat(here.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return why;
  why += fmt::format("; {} is here", here);
  if (!S_ISREG(st.st_mode)) return why + ", but it is not a regular file";
  if (access(here.c_str(), X_OK) != 0) {
    return why + (is_python_script(name) ? ", but it is not executable" + run_python_instead(name)
                                         : ", but it is not executable (chmod +x it)");
  }
  return why + fmt::format(": start it as {}", here);
}

std::optional<std::string> why_interpreter_fails(const std::string& program) {
  const auto found = interpreter_of(program);
  if (!found && is_python_script(program) && may_be_script(program))
    return "is a Python script without a #! line, whose lines /bin/sh would run as commands" +
           run_python_instead(program);
  if (!found) return std::nullopt;
  const std::string& interpreter = *found;
  // A file saved with Windows line ends: the kernel looks for "/bin/sh\r".
  const bool windows = interpreter.back() == '\r';
  const std::string shown = windows ? interpreter.substr(0, interpreter.size() - 1) + "\\r"
                                    : interpreter;
  struct stat st {};
  std::string why;
  if (stat(interpreter.c_str(), &st) != 0) why = "is not found";
  else if (S_ISDIR(st.st_mode)) why = "is a directory";
  else if (access(interpreter.c_str(), X_OK) != 0) why = "is not executable";
  else return std::nullopt;
  if (windows)
    return fmt::format("has Windows line ends: the interpreter on its #! line, '{}', {}; "
                       "convert the file (dos2unix {})",
                       shown, why, program);
  return fmt::format("cannot be run: the interpreter on its #! line, '{}', {}; install it or "
                     "correct the #! line",
                     shown, why);
}

SpawnedChild spawn_child(const std::string& program, const std::vector<std::string>& argv,
                         const std::vector<std::string>& env, Capture capture,
                         const std::vector<int>& cpus, bool heartbeat) {
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Built before fork: the child may not allocate.
  static char shell[] = "/bin/sh";
  std::vector<char*> as_script{shell, const_cast<char*>(program.c_str())};
  as_script.insert(as_script.end(), args.begin() + (argv.empty() ? 0 : 1), args.end());
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // A "#!" script the kernel would not run has an interpreter that is not a
  // program for this machine: /bin/sh must not read it as commands either.
  const auto interpreter = interpreter_of(program);
  const bool script = !interpreter && may_be_script(program);
  const std::string not_runnable =
      interpreter ? fmt::format("lockstep-run: cannot execute {}: Exec format error: the "
                                "interpreter on its #! line, '{}', is not a program for this "
                                "machine (built for another architecture?)\n",
                                program, *interpreter)
                  : fmt::format("lockstep-run: cannot execute {}: Exec format error: it is "
                                "neither a program for this machine (built for another "
                                "architecture?) nor a script (a text file, or one starting "
                                "with a #! line)\n",
                                program);

  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  if (capture != Capture::none) {
    LOCKSTEP_CHECK(pipe2(out, O_CLOEXEC) == 0 &&
                       (capture == Capture::merged || pipe2(err, O_CLOEXEC) == 0),
                   "cannot create output pipes for rank: {}", strerror(errno));
  }
  // One pipe for both keeps the order in which the child wrote them.
  if (capture == Capture::merged) err[1] = out[1];
  int beats[2] = {-1, -1};  // [0] ours, [1] the child's
  if (heartbeat) {
    LOCKSTEP_CHECK(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, beats) == 0,
                   "cannot create a heartbeat socket for a rank: {}", strerror(errno));
  }
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  for (int cpu : cpus) CPU_SET(cpu, &cpu_set);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  LOCKSTEP_CHECK(pid >= 0, "cannot fork a rank process: {}", strerror(errno));
  if (pid == 0) {
    exec_child(launcher, program.c_str(), args.data(), script ? as_script.data() : nullptr,
               not_runnable.c_str(), envp.data(), out[1], err[1], beats[1],
               cpus.empty() ? nullptr : &cpu_set);
  }

  setpgid(pid, pid);  // also here, so the group exists before we may signal it
  SpawnedChild child;
  child.pid = pid;
  if (capture != Capture::none) {
    close(out[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    child.stdout_fd = out[0];
  }
  if (capture == Capture::separate) {
    close(err[1]);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    child.stderr_fd = err[0];
  }
  if (heartbeat) {
    close(beats[1]);
    fcntl(beats[0], F_SETFL, O_NONBLOCK);
    child.heartbeat_fd = beats[0];
  }
  return child;
}

}  // namespace lockstep::launcher
