#include "lockstep/runtime/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iostream>
#include <set>

#include "lockstep/runtime/checkpoint/atomic_file.h"

namespace lockstep::runtime {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSuffix = ".safetensors";

std::optional<double> parse_metric(const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find(kMetricKey);
  if (it == metadata.end()) return std::nullopt;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    return std::nullopt;  // "nan" parses; anything else is not a metric
  }
}

}  // namespace

CheckpointDir::CheckpointDir(fs::path dir, CheckpointDirOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  LOCKSTEP_CHECK(options_.keep_last >= 1, "CheckpointDir {}: keep_last is {}, must be at least 1",
                 dir_.string(), options_.keep_last);
  LOCKSTEP_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos,
                 "CheckpointDir {}: prefix '{}' must be a non-empty file name part", dir_.string(),
                 options_.prefix);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  LOCKSTEP_CHECK(!ec, "CheckpointDir: cannot create directory {}: {}", dir_.string(), ec.message());
  for (const auto& p : remove_stale_temp_files(dir_))
    warn(fmt::format("removed {}, left by a checkpoint writer that did not finish", p.string()));
}

fs::path CheckpointDir::path_for_step(int64_t step) const {
  return dir_ / fmt::format("{}-{:010}{}", options_.prefix, step, kSuffix);
}

std::optional<int64_t> CheckpointDir::step_of(const std::string& name) const {
  const std::string head = options_.prefix + "-";
  if (name.size() <= head.size() + kSuffix.size() || name.rfind(head, 0) != 0 ||
      !name.ends_with(kSuffix))
    return std::nullopt;
  const char* begin = name.data() + head.size();
  const char* end = name.data() + name.size() - kSuffix.size();
  int64_t step = -1;
  auto [p, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || p != end || step < 0 || *begin == '+') return std::nullopt;
  return step;
}

bool CheckpointDir::better(double a, double b) const {
  return options_.best == BestMode::min ? a < b : a > b;
}

void CheckpointDir::warn(const std::string& message) const {
  if (options_.warn)
    options_.warn(message);
  else
    std::cerr << "lockstep: warning: " << message << std::endl;
}

CheckpointEntry CheckpointDir::save(const CheckpointContent& content, int64_t step,
                                    std::optional<double> metric, const SaveOptions& save) {
  LOCKSTEP_CHECK(step >= 0, "CheckpointDir {}: step {} is negative", dir_.string(), step);
  // The step and metric go into the file itself, so the directory alone tells
  // a restarted run which checkpoint is the best.
  CheckpointContent c{.tensors = content.tensors, .metadata = content.metadata};
  c.metadata[kStepKey] = std::to_string(step);
  c.metadata.erase(kMetricKey);
  if (metric) c.metadata[kMetricKey] = fmt::format("{:.17g}", *metric);
  CheckpointEntry saved{.path = path_for_step(step), .step = step, .metric = metric};
  save_checkpoint(saved.path, c, save);

  // Retention, after the new file is durable: a crash in between leaves one
  // file too many, never one too few.
  const auto entries = list();
  std::set<fs::path> keep;
  for (size_t i = entries.size() > size_t(options_.keep_last) ? entries.size() - options_.keep_last
                                                              : 0;
       i < entries.size(); ++i)
    keep.insert(entries[i].path);
  if (auto b = best()) keep.insert(b->path);
  bool removed = false;
  for (const auto& e : entries) {
    if (keep.count(e.path)) continue;
    std::error_code ec;
    fs::remove(e.path, ec);
    if (ec) warn(fmt::format("cannot remove old checkpoint {}: {}", e.path.string(), ec.message()));
    removed = removed || !ec;
  }
  if (removed) fsync_directory(dir_);
  return saved;
}

std::vector<CheckpointEntry> CheckpointDir::list() const {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_, ec)) {
    auto step = step_of(f.path().filename().string());
    if (!step || !f.is_regular_file(ec)) continue;
    CheckpointEntry e{.path = f.path(), .step = *step};
    try {
      e.metric = parse_metric(read_safetensors_header(f.path().string()).metadata);
    } catch (const Error&) {
      // Listed without a metric: latest() and load reports say what is wrong.
    }
    out.push_back(std::move(e));
  }
  LOCKSTEP_CHECK(!ec, "CheckpointDir: cannot list {}: {}", dir_.string(), ec.message());
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointEntry> CheckpointDir::best() const {
  if (options_.best == BestMode::none) return std::nullopt;
  std::optional<CheckpointEntry> best;
  for (auto& e : list()) {
    if (!e.metric || std::isnan(*e.metric)) continue;  // a NaN never counts as best
    if (!best || better(*e.metric, *best->metric)) best = e;
  }
  return best;
}

std::optional<LoadedCheckpoint> CheckpointDir::load_latest(const LoadOptions& load) const {
  auto entries = list();
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    try {
      CheckpointContent content = load_checkpoint(it->path, load);
      return LoadedCheckpoint{.entry = *it, .content = std::move(content)};
    } catch (const Error& e) {
      if (options_.on_corrupt == OnCorrupt::throw_error) throw;
      warn(fmt::format("skipping checkpoint {} (step {}), it does not load: {}", it->path.string(),
                       it->step, e.what()));
    }
  }
  return std::nullopt;
}

std::optional<CheckpointEntry> CheckpointDir::latest() const {
  auto loaded = load_latest();
  if (!loaded) return std::nullopt;
  return loaded->entry;
}

}  // namespace lockstep::runtime
