#include "lockstep/runtime/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <iostream>
#include <random>
#include <set>

#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/checkpoint/metadata_text.h"

namespace lockstep::runtime {

namespace fs = std::filesystem;

namespace {

// What to do when a save failed for room: the file system is full (or the
// user's quota), or the file outgrew a size limit (ulimit -f).
std::string out_of_room_advice(const std::string& error, int keep_last) {
  for (const int err : {ENOSPC, EDQUOT, EFBIG}) {
    if (error.find(std::strerror(err)) == std::string::npos) continue;
    return fmt::format(
        ". A save needs room for one checkpoint more than the directory keeps (keep_last {}, "
        "and the best) until it removes the oldest: free space there, keep fewer, or save "
        "elsewhere",
        keep_last);
  }
  return "";
}

constexpr std::string_view kSuffix = ".safetensors";

std::optional<double> parse_metric(const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find(kMetricKey);
  if (it == metadata.end()) return std::nullopt;
  return parse_metadata_number(it->second);  // "nan" parses; anything else is not a metric
}

// Whose a file is, for messages: "run 3f..", "a run saved without a run id".
std::string owner_of(const CheckpointEntry& e) {
  if (!e.unreadable.empty()) return fmt::format("a file whose header does not read ({})", e.unreadable);
  if (!e.run_id) return "a checkpoint saved without a run id (by an earlier version)";
  return fmt::format("a checkpoint of another run, {}", *e.run_id);
}

// "20261126-142501": when a set-aside folder was made, in UTC.
std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &tm);
  return text;
}

// Why `dir` cannot be created, where the system's reason misleads: a part of
// it is a symbolic link to nothing (a file system not mounted, a link copied
// from another machine), for which mkdir says "File exists". Empty otherwise.
std::string dangling_link_in(const fs::path& dir) {
  std::error_code ec;
  const fs::path whole = fs::absolute(dir, ec);
  for (fs::path p = whole; !ec && !p.empty(); p = p.parent_path()) {
    std::error_code link, target;
    if (fs::is_symlink(fs::symlink_status(p, link)) && !fs::exists(fs::status(p, target))) {
      fs::path to = fs::read_symlink(p, link);
      if (to.is_relative()) to = (p.parent_path() / to).lexically_normal();
      return fmt::format("{} is a symbolic link to {}, which does not exist (a file system that "
                         "is not mounted, or a link from another machine); mount or create "
                         "{}, or pick another checkpoint directory",
                         p.string(), to.string(), to.string());
    }
    if (p == p.root_path()) break;
  }
  return "";
}

}  // namespace

std::string new_run_id() {
  std::random_device device;
  const uint64_t high = device(), low = device();
  return fmt::format("{:016x}", (high << 32) ^ low);
}

CheckpointDir::CheckpointDir(fs::path dir, CheckpointDirOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  set_keep_last(options_.keep_last);
  LOCKSTEP_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos,
                 "CheckpointDir {}: prefix '{}' must be a non-empty file name part", dir_.string(),
                 options_.prefix);
  if (options_.read_only) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    const std::string dangling = dangling_link_in(dir_);
    LOCKSTEP_CHECK(dangling.empty(), "cannot create checkpoint directory {}: {}", dir_.string(),
                   dangling);
  }
  LOCKSTEP_CHECK(!ec,
                 "cannot create checkpoint directory {}: {}; pick a directory this user can "
                 "create and write",
                 dir_.string(), ec.message());
  try {
    check_can_create_files(dir_);
  } catch (const Error& e) {
    throw Error(fmt::format("{}; pick a checkpoint directory this user can write", e.what()));
  }
  remove_stale_temp_files_with_warning();
}

void CheckpointDir::set_keep_last(int keep_last) {
  LOCKSTEP_CHECK(keep_last >= 1, "CheckpointDir {}: keep_last is {}, must be at least 1",
                 dir_.string(), keep_last);
  options_.keep_last = keep_last;
}

void CheckpointDir::set_run(CheckpointRun run) {
  for (const auto& [key, value] : run.metadata) {
    LOCKSTEP_CHECK(!key.starts_with("lockstep."),
                   "CheckpointDir {}: run metadata '{}': keys starting with \"lockstep.\" are "
                   "the directory's own; rename it",
                   dir_.string(), key);
    LOCKSTEP_CHECK(is_utf8(key) && is_utf8(value),
                   "CheckpointDir {}: run metadata '{}' = \"{}\" is not UTF-8 text, which a "
                   "safetensors header (JSON) cannot hold; record the bytes escaped "
                   "(runtime::escape_bytes)",
                   dir_.string(), escape_bytes(key), escape_bytes(value));
  }
  LOCKSTEP_CHECK(is_utf8(run.id) && is_utf8(run.job),
                 "CheckpointDir {}: run id \"{}\" or job \"{}\" is not UTF-8 text",
                 dir_.string(), escape_bytes(run.id), escape_bytes(run.job));
  run_ = std::move(run);
}

void CheckpointDir::remove_stale_temp_files_with_warning() const {
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
  // Only the name this directory gives the step: "ckpt-300.safetensors" is a
  // copy the user made and named, which retention must not delete.
  if (path_for_step(step).filename() != name) return std::nullopt;
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
  LOCKSTEP_CHECK(!options_.read_only, "CheckpointDir {}: opened read-only, cannot save",
                 dir_.string());
  LOCKSTEP_CHECK(step >= 0, "CheckpointDir {}: step {} is negative", dir_.string(), step);
  // A writer that died since the last save (a zombie included) left its
  // temporary file; it is nobody's now.
  remove_stale_temp_files_with_warning();
  if (run_.id.empty()) run_.id = new_run_id();
  CheckpointEntry saved{.path = path_for_step(step), .step = step, .metric = metric,
                        .run_id = run_.id};
  if (!run_.job.empty()) saved.job_id = run_.job;
  // The run's own file of this step may be replaced (a run resumed from an
  // earlier step saves it again); anyone else's stays, as retention leaves it.
  std::error_code ec;
  if (fs::exists(fs::symlink_status(saved.path, ec))) {
    const CheckpointEntry there = entry_for(saved.path);
    LOCKSTEP_CHECK(there.unreadable.empty() && there.run_id == run_.id,
                   "CheckpointDir {}: not saving step {} of run {}: {} already exists and is {}. "
                   "Nothing was written; a run never replaces another's checkpoint. Save this "
                   "run into another directory, or move that file away",
                   dir_.string(), step, run_.id, saved.path.string(), owner_of(there));
  }
  // The step, metric, run and job go into the file itself, so the directory
  // alone tells a restarted run which checkpoints are its own and which is best.
  CheckpointContent c{.tensors = content.tensors, .metadata = content.metadata};
  for (const auto& [key, value] : run_.metadata) c.metadata[key] = value;
  for (const char* key : {kStepKey, kRunKey, kJobKey, kMetricKey}) c.metadata.erase(key);
  c.metadata[kStepKey] = std::to_string(step);
  c.metadata[kRunKey] = run_.id;
  if (saved.job_id) c.metadata[kJobKey] = *saved.job_id;
  if (metric) c.metadata[kMetricKey] = metadata_number(*metric);
  try {
    save_checkpoint(saved.path, c, save);
  } catch (const Error& e) {
    throw Error(fmt::format("CheckpointDir {}: saving step {} failed, and the checkpoints there "
                            "are as they were: {}{}",
                            dir_.string(), step, e.what(),
                            out_of_room_advice(e.what(), options_.keep_last)));
  }

  // Retention, after the new file is durable (a crash in between leaves one
  // file too many, never one too few), among this run's files up to the
  // newest save: the last keep_last of them (the new one among them) and the
  // best. Other runs' files and unreadable ones are not ours to delete.
  std::vector<CheckpointEntry> mine;
  for (auto& e : list())
    if (e.run_id == run_.id && e.step <= step) mine.push_back(std::move(e));
  std::set<fs::path> keep = {saved.path};
  for (size_t i = mine.size() > size_t(options_.keep_last) ? mine.size() - options_.keep_last : 0;
       i < mine.size(); ++i)
    keep.insert(mine[i].path);
  if (auto b = best_of(mine)) keep.insert(b->path);
  bool removed = false;
  for (const auto& e : mine) {
    if (keep.count(e.path)) continue;
    std::error_code ec;
    fs::remove(e.path, ec);
    if (ec) warn(fmt::format("cannot remove old checkpoint {}: {}", e.path.string(), ec.message()));
    removed = removed || !ec;
  }
  if (removed) fsync_directory(dir_);
  return saved;
}

CheckpointEntry CheckpointDir::entry_for(const fs::path& file) const {
  CheckpointEntry e{.path = file, .step = step_of(file.filename().string()).value_or(0)};
  try {
    const auto metadata = read_safetensors_header(file.string()).metadata;
    e.metric = parse_metric(metadata);
    if (auto it = metadata.find(kRunKey); it != metadata.end()) e.run_id = it->second;
    if (auto it = metadata.find(kJobKey); it != metadata.end()) e.job_id = it->second;
  } catch (const Error& error) {
    e.unreadable = error.what();  // latest() and load reports say the rest
  }
  return e;
}

std::vector<CheckpointEntry> CheckpointDir::list() const {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_, ec)) {
    auto step = step_of(f.path().filename().string());
    if (!step || !f.is_regular_file(ec)) continue;
    out.push_back(entry_for(f.path()));
  }
  LOCKSTEP_CHECK(!ec, "CheckpointDir: cannot list {}: {}", dir_.string(), ec.message());
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointEntry> CheckpointDir::best_of(
    const std::vector<CheckpointEntry>& entries) const {
  if (options_.best == BestMode::none) return std::nullopt;
  std::optional<CheckpointEntry> best;
  for (const auto& e : entries) {
    if (!e.metric || std::isnan(*e.metric)) continue;  // a NaN never counts as best
    if (!best || better(*e.metric, *best->metric)) best = e;
  }
  return best;
}

std::optional<CheckpointEntry> CheckpointDir::best() const {
  std::vector<CheckpointEntry> entries = list();
  if (!run_.id.empty())
    std::erase_if(entries, [&](const CheckpointEntry& e) { return e.run_id != run_.id; });
  return best_of(entries);
}

std::optional<LoadedCheckpoint> CheckpointDir::load_latest(const LoadOptions& load) const {
  // A reader beside a running job (an evaluator polling the directory) races
  // its retention: a file listed here may be deleted before it is opened,
  // once a newer one is durable. A file that is gone is not corrupt, and the
  // older ones may be going too: the directory is listed again, which finds
  // the newer file. Each listing that changes so comes after a save, so this
  // ends; a directory that changes under every one of many is reported.
  constexpr int kListings = 100;
  std::set<fs::path> warned;  // a corrupt file is reported once, not per listing
  for (int listing = 1;; ++listing) {
    bool vanished = false;
    const auto entries = list();
    for (auto it = entries.rbegin(); it != entries.rend() && !vanished; ++it) {
      try {
        CheckpointContent content = load_checkpoint(it->path, load);
        return LoadedCheckpoint{.entry = *it, .content = std::move(content)};
      } catch (const Error& e) {
        std::error_code ec;
        vanished = !fs::exists(fs::symlink_status(it->path, ec));
        if (vanished) continue;
        if (options_.on_corrupt == OnCorrupt::throw_error) throw;
        if (warned.insert(it->path).second)
          warn(fmt::format("skipping checkpoint {} (step {}), it does not load: {}",
                           it->path.string(), it->step, e.what()));
      }
    }
    if (!vanished) return std::nullopt;
    LOCKSTEP_CHECK(listing < kListings,
                   "CheckpointDir {}: checkpoints were deleted between listing the directory and "
                   "opening them, {} times in a row; is something other than the run's retention "
                   "deleting them? Read a copy of the directory instead",
                   dir_.string(), kListings);
  }
}

std::optional<CheckpointEntry> CheckpointDir::latest() const {
  auto loaded = load_latest();
  if (!loaded) return std::nullopt;
  return loaded->entry;
}

fs::path CheckpointDir::set_aside() {
  LOCKSTEP_CHECK(!options_.read_only, "CheckpointDir {}: opened read-only, cannot move files",
                 dir_.string());
  const auto entries = list();
  if (entries.empty()) return {};
  // A new folder every time: files set aside earlier are never mixed in or replaced.
  const std::string stem = fmt::format("{}-set-aside-{}", options_.prefix, utc_timestamp());
  fs::path target = dir_ / stem;
  std::error_code ec;
  for (int n = 2; !fs::create_directory(target, ec); ++n) {
    LOCKSTEP_CHECK(!ec && n < 1000, "cannot create {} to move old checkpoints into: {}",
                   target.string(), ec ? ec.message() : "too many folders of that name");
    target = dir_ / fmt::format("{}-{}", stem, n);
  }
  for (const auto& e : entries) {
    fs::rename(e.path, target / e.path.filename(), ec);
    LOCKSTEP_CHECK(!ec, "cannot move {} into {}: {}", e.path.string(), target.string(),
                   ec.message());
  }
  fsync_directory(target);
  fsync_directory(dir_);
  return target;
}

}  // namespace lockstep::runtime
