// What every benchmark shares: timing with warm-up and a median, a peer
// process whose JSON result is read back, and output as a table or JSON.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <sys/wait.h>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lockstep/runtime/cpu/openblas_core.h"

namespace lockstep::bench {

// The median of `v` (0 when empty): of an even count, the mean of the two
// middle values, as Python's statistics.median that the PyTorch peers report;
// the upper one alone would be the slower of two steps at --steps 2.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1) return *mid;
  return (*std::max_element(v.begin(), mid) + *mid) / 2;
}

// Median seconds of `steps` calls of fn after `warmup` untimed calls.
inline double median_seconds(const std::function<void()>& fn, int warmup, int steps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t(static_cast<size_t>(steps));
  for (auto& seconds : t) {
    auto start = std::chrono::steady_clock::now();
    fn();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return median(std::move(t));
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout only; stderr goes to ours
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Whether `program` can be run: a path that exists, or a bare name on PATH.
inline bool program_exists(const std::string& program) {
  if (program.find('/') != std::string::npos) return std::filesystem::exists(program);
  return run_command("command -v '" + program + "' >/dev/null 2>&1").exit_code == 0;
}

// A plain text table: a header row, then rows, columns padded to fit.
inline std::string format_table(const std::vector<std::string>& header,
                                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (size_t c = 0; c < w.size(); ++c)
      s += fmt::format(" {:<{}} |", c < cells.size() ? cells[c] : "", w[c]);
    return s + "\n";
  };
  std::string out = line(header) + "|";
  for (size_t c = 0; c < w.size(); ++c) out += std::string(w[c] + 2, '-') + "|";
  out += "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

// Writes `doc` (indented) to `file`; an error names the file.
inline void write_json_file(const nlohmann::json& doc, const std::string& file) {
  std::ofstream f(file);
  f << doc.dump(2) << "\n";
  if (!f) throw std::runtime_error("cannot write " + file);
}

// Writes `doc` to `file` when one is given, else one line to stdout.
inline void print_json(const nlohmann::json& doc, const std::string& file) {
  if (!file.empty())
    write_json_file(doc, file);
  else
    std::cout << doc.dump() << "\n";
}

// One-line description of this machine for the results.
inline std::string machine_description() {
  std::string model = "unknown CPU";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      std::string s(line);
      if (s.rfind("model name", 0) == 0) {
        model = s.substr(s.find(':') + 2);
        model.erase(model.find_last_not_of("\n ") + 1);
        break;
      }
    }
    std::fclose(f);
  }
  return fmt::format("{}, {} cores, {}", model, std::max(1u, std::thread::hardware_concurrency()),
                     runtime::cpu::blas_description());
}

// The environment a peer (PyTorch on the same OpenBLAS) needs to run the
// kernels this process runs: OPENBLAS_CORETYPE where lockstep replaced
// OpenBLAS's choice (runtime/cpu/openblas_core.h), else nothing.
inline nlohmann::json peer_env() {
  const runtime::cpu::BlasCore core = runtime::cpu::blas_core();
  if (core.detected.empty()) return nlohmann::json::object();
  return {{"OPENBLAS_CORETYPE", core.name}};
}

// peer_env() as "NAME=value " assignments to put before a shell command.
inline std::string peer_env_prefix() {
  std::string prefix;
  const nlohmann::json env = peer_env();
  for (const auto& [name, value] : env.items())
    prefix += name + "=" + value.get<std::string>() + " ";
  return prefix;
}

}  // namespace lockstep::bench
