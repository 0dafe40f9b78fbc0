// Checkpoint write and read throughput beside the disk's own.
//
//   build/bin/checkpoint_bench [--dir DIR] [--sizes 16,64,256] [--json FILE]
//
// For each size (MiB of f32 parameters, split into realistic tensor sizes;
// rates are in MB/s, 10^6 bytes a second, as disks are rated):
//   plain write  the same number of bytes from one buffer, 16 MiB writes, fsync
//   ckpt write   save_checkpoint: safetensors + CRC-32s, temporary file,
//                fsync, rename, fsync of the directory
//   plain read   the plain file into a reused buffer, 16 MiB reads
//   ckpt read    load_checkpoint: header checks, fresh tensors, CRC-32s
// Writes go to a new file each time (the previous one is removed, untimed).
// Reads start cold: the file's pages are dropped from the page cache first
// (posix_fadvise DONTNEED after an fsync; no root needed), unless --hot.
// The goal: checkpoint write at >= 80% of the plain write.
#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "common/writable_file.h"
#include "harness.h"
#include "lockstep/runtime/checkpoint/checkpoint.h"

using namespace lockstep;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr size_t kIo = size_t{16} << 20;
constexpr double kWriteGoal = 0.8;  // checkpoint write / plain write

struct Options {
  std::string dir;
  std::vector<int> sizes_mib = {16, 64, 256};
  int warmup = 1;
  int iters = 3;
  bool hot = false;
  std::string json_file;
};

std::string filesystem_type(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs (memory: not a disk)";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0x2FC12FC1:
      return "zfs";
    default:
      return fmt::format("unknown (f_type {:#x})", static_cast<unsigned long>(s.f_type));
  }
}

// Parameters like a model's: large weight matrices with small biases between.
runtime::CheckpointContent model_of(int64_t mib) {
  const int64_t pattern[] = {1 << 20, 1024, 512 << 10, 768, 256 << 10, 256};  // floats
  runtime::CheckpointContent c;
  int64_t left = mib << 18;  // floats
  for (int i = 0; left > 0; ++i) {
    const int64_t n = std::min(pattern[i % 6], left);
    runtime::Tensor t = runtime::Tensor::empty({n});
    float* p = t.data_ptr<float>();
    for (int64_t k = 0; k < n; ++k) p[k] = static_cast<float>((k * 2654435761u) % 1000) * 1e-3f;
    c.tensors.emplace_back(fmt::format("layer{}.{}", i / 2, i % 2 ? "bias" : "weight"), t);
    left -= n;
  }
  c.metadata = {{"benchmark", "checkpoint_bench"}};
  return c;
}

void check_sys(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + ": " + std::strerror(errno));
}

void plain_write(const std::string& path, const char* data, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check_sys(fd >= 0, "open " + path);
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(fd, data + done, std::min(kIo, n - done));
    check_sys(w > 0, "write " + path);
    done += static_cast<size_t>(w);
  }
  check_sys(::fsync(fd) == 0, "fsync " + path);
  ::close(fd);
}

void plain_read(const std::string& path, char* data, size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_sys(fd >= 0, "open " + path);
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::read(fd, data + done, std::min(kIo, n - done));
    check_sys(r > 0, "read " + path);
    done += static_cast<size_t>(r);
  }
  ::close(fd);
}

// Drops the file's pages from the page cache, so the next read hits the disk.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_sys(fd >= 0, "open " + path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double mbps(uint64_t bytes, double seconds) { return bytes / seconds / 1e6; }

// The 1-minute load average: other work on the machine slows the checkpoint
// (which computes CRCs) more than the plain write, so the results carry it.
double load_average() {
  double load = -1;
  std::ifstream("/proc/loadavg") >> load;
  return load;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Checkpoint write/read throughput beside a plain write/read of the same bytes."};
  app.add_option("--dir", o.dir,
                 "where to measure: the files go in a fresh directory made in it and removed at "
                 "the end (default: /var/tmp)");
  app.add_option("--sizes", o.sizes_mib, "checkpoint sizes in MiB (2^20 bytes)")
      ->delimiter(',')
      ->check(cli_checks::positive);
  app.add_option("--iters", o.iters, "timed runs per measurement (median reported)")
      ->check(cli_checks::positive);
  app.add_option("--warmup", o.warmup, "untimed runs first")->check(cli_checks::non_negative);
  app.add_flag("--hot", o.hot, "read from the page cache instead of evicting the file first");
  app.add_option("--json", o.json_file, "also write the results as JSON to this file")
      ->check(bench::writable_file);
  CLI11_PARSE(app, argc, argv);

  try {
    if (o.dir.empty()) o.dir = "/var/tmp";
    // A directory of its own in --dir, removed on every exit, a failed write
    // (a full disk) included: no file of the user's is overwritten, and no
    // checkpoint of the run is left behind.
    struct Scratch {
      fs::path path;
      ~Scratch() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
      }
    } scratch{fs::path(o.dir) / fmt::format("lockstep-checkpoint-bench-{}", ::getpid())};
    fs::create_directories(scratch.path);
    const std::string fstype = filesystem_type(o.dir);

    json results = json::array();
    std::vector<std::vector<std::string>> rows;
    for (int mib : o.sizes_mib) {
      const runtime::CheckpointContent content = model_of(mib);
      const std::string ckpt = scratch.path / "bench.safetensors";
      const std::string plain = scratch.path / "plain.bin";
      const uint64_t bytes = runtime::save_checkpoint(ckpt, content);
      // The plain file: the checkpoint's bytes, from one buffer.
      std::unique_ptr<char[]> buffer(new char[bytes]);
      std::ifstream(ckpt, std::ios::binary).read(buffer.get(), bytes);

      // Each run starts with setup() untimed: writes go to a new file (the old
      // one removed first: freeing a large file's pages and blocks costs as
      // much as tens of ms, a cost of retention, not of writing), reads start
      // from a cold cache unless --hot.
      auto timed = [&](const std::function<void()>& setup, const std::function<void()>& run) {
        std::vector<double> t;
        for (int i = 0; i < o.warmup + o.iters; ++i) {
          setup();
          const auto start = std::chrono::steady_clock::now();
          run();
          const auto stop = std::chrono::steady_clock::now();
          if (i >= o.warmup) t.push_back(std::chrono::duration<double>(stop - start).count());
        }
        return bench::median(std::move(t));
      };
      auto fresh = [](const std::string& path) { return [path] { fs::remove(path); }; };
      auto cold = [&](const std::string& path) {
        return [&, path] {
          if (!o.hot) evict(path);
        };
      };
      const double w_plain = timed(fresh(plain), [&] { plain_write(plain, buffer.get(), bytes); });
      const double w_ckpt = timed(fresh(ckpt), [&] { runtime::save_checkpoint(ckpt, content); });
      const double r_plain = timed(cold(plain), [&] { plain_read(plain, buffer.get(), bytes); });
      const double r_ckpt = timed(cold(ckpt), [&] { runtime::load_checkpoint(ckpt); });

      results.push_back({{"size_mib", mib},
                         {"bytes", bytes},
                         {"tensors", content.tensors.size()},
                         {"plain_write_mb_s", mbps(bytes, w_plain)},
                         {"checkpoint_write_mb_s", mbps(bytes, w_ckpt)},
                         {"write_ratio", w_plain / w_ckpt},
                         {"plain_read_mb_s", mbps(bytes, r_plain)},
                         {"checkpoint_read_mb_s", mbps(bytes, r_ckpt)},
                         {"read_ratio", r_plain / r_ckpt}});
      rows.push_back(
          {std::to_string(mib), std::to_string(content.tensors.size()),
           fmt::format("{:.0f}", mbps(bytes, w_plain)), fmt::format("{:.0f}", mbps(bytes, w_ckpt)),
           fmt::format("{:.0f}%", 100 * w_plain / w_ckpt),
           fmt::format("{:.0f}", mbps(bytes, r_plain)), fmt::format("{:.0f}", mbps(bytes, r_ckpt)),
           fmt::format("{:.0f}%", 100 * r_plain / r_ckpt)});
      fs::remove(ckpt);
      fs::remove(plain);
    }

    const double load = load_average();
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    fmt::print(
        "checkpoint_bench {} on {} (load average {:.1f})\ndir {} ({}), median of {} runs after {} "
        "warm-up, {} reads\n",
        date, bench::machine_description(), load, o.dir, fstype, o.iters, o.warmup,
        o.hot ? "hot (page cache)" : "cold (evicted first)");
    fmt::print("{}", bench::format_table(
                         {"MiB", "tensors", "plain write MB/s", "ckpt write MB/s", "write vs plain",
                          "plain read MB/s", "ckpt read MB/s", "read vs plain"},
                         rows));
    // The goal, judged at the size where the checkpoint write does worst.
    const json* worst = nullptr;
    for (const auto& r : results)
      if (worst == nullptr || r["write_ratio"] < (*worst)["write_ratio"]) worst = &r;
    const bool goal_met = worst == nullptr || (*worst)["write_ratio"].get<double>() >= kWriteGoal;
    if (worst != nullptr) {
      fmt::print("# goal: checkpoint write >= {:.0f}% of the plain write: {} (lowest {:.0f}%, "
                 "at {} MiB)\n",
                 100 * kWriteGoal, goal_met ? "met at every size" : "MISSED",
                 100 * (*worst)["write_ratio"].get<double>(), (*worst)["size_mib"].get<int64_t>());
    }
    if (!o.json_file.empty()) {
      json doc = {{"benchmark", "checkpoint_bench"},
                  {"date", date},
                  {"machine", bench::machine_description()},
                  {"dir", o.dir},
                  {"filesystem", fstype},
                  {"iters", o.iters},
                  {"warmup", o.warmup},
                  {"reads", o.hot ? "hot" : "cold"},
                  {"write_goal", kWriteGoal},
                  {"write_goal_met", goal_met},
                  {"results", results}};
      bench::write_json_file(doc, o.json_file);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "checkpoint_bench: error: {}\n", e.what());
    return 1;
  }
}
