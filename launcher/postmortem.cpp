#include "launcher/postmortem.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "launcher/process_identity.h"
#include "lockstep/runtime/error.h"
#include "lockstep/distributed/flight_recorder.h"

namespace lockstep::launcher {

RankHistory read_rank_history(const std::string& path, int rank, int node,
                              const std::string& host, int64_t pid) {
  if (path.empty()) {
    return RankHistory{.rank = rank, .node = node, .host = host, .pid = pid,
                       .no_record = "its launcher had nowhere to keep flight records"};
  }
  const int64_t now = distributed::monotonic_ns();
  try {
    const auto records = distributed::read_flight_recorder_file(path);
    if (records) {
      auto history = distributed::rank_history(*records, now, rank, node, host, pid);
      history.stopped = process_stopped(static_cast<pid_t>(pid));
      return history;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-run: rank {}'s flight record is unreadable: {}\n", rank, e.what());
  }
  return RankHistory{.rank = rank, .node = node, .host = host, .pid = pid};
}

namespace {

// More ranks than any job has: a part saying so is damaged, and believing it
// would have the report list (and sort) that many ranks.
constexpr int kMaxWorldSize = 1 << 20;

// What makes a part's world size or ranks impossible; empty if nothing.
std::string damaged_ranks(const Postmortem& part) {
  if (part.world_size < 0 || part.world_size > kMaxWorldSize)
    return fmt::format("its world_size {} is not a job's size (0 to {} ranks): the part is "
                       "damaged; remove it",
                       part.world_size, kMaxWorldSize);
  const int ranks = part.world_size > 0 ? part.world_size : kMaxWorldSize;
  for (const auto& r : part.ranks) {
    if (r.rank < 0 || r.rank >= ranks)
      return fmt::format("it names rank {}, not a rank of its {}-rank job: the part is "
                         "damaged; remove it",
                         r.rank, ranks);
  }
  return {};
}

}  // namespace

Postmortem read_rank_postmortems(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<Postmortem> parts;
  // A part that cannot be read (cut short by a kill, or not a post-mortem)
  // costs its rank's lines, not the report: rank -> why.
  std::vector<std::pair<int, std::string>> unreadable;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("lockstep-postmortem-rank", 0) != 0 || entry.path().extension() != ".json")
      continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why, what = "unreadable: cut short, or not a post-mortem";
    try {
      Postmortem part = distributed::postmortem_from_json_text(text);
      why = damaged_ranks(part);
      if (why.empty()) {
        parts.push_back(std::move(part));
        continue;
      }
      what = "damaged";
    } catch (const std::exception& e) {
      why = e.what();
    }
    int rank = -1;
    if (std::sscanf(name.c_str(), "lockstep-postmortem-rank%d.json", &rank) != 1 || rank < 0)
      continue;  // not a rank's part by its name
    fmt::print(stderr, "lockstep-run: {}: {}\n", entry.path().string(), why);
    unreadable.emplace_back(
        rank, fmt::format("its part {} is {}", entry.path().string(), what));
  }
  LOCKSTEP_CHECK(!error, "cannot read the directory {}: {}", dir, error.message());
  LOCKSTEP_CHECK(unreadable.empty() || !parts.empty(),
                 "no part in {} can be read: {}", dir, unreadable.front().second);
  LOCKSTEP_CHECK(!parts.empty(),
                 "{} holds no lockstep-postmortem-rank<R>.json: ranks write one there when "
                 "LOCKSTEP_POSTMORTEM_DIR={} is in their environment and a collective of theirs "
                 "fails",
                 dir, dir);
  // The last attempt's parts only: a rank of it that wrote none may have left
  // one of an earlier attempt, which says nothing of this one.
  const Postmortem& newest = *std::max_element(
      parts.begin(), parts.end(),
      [](const Postmortem& a, const Postmortem& b) { return a.written_unix_s < b.written_unix_s; });
  const std::string attempt = newest.attempt;
  const int world_size = newest.world_size;
  // Drops the parts `other` says are not of the newest's job, saying so.
  const auto leave_out = [&](const auto& other, const std::string& why) {
    std::vector<int> left;
    std::erase_if(parts, [&](const Postmortem& part) {
      if (!other(part)) return false;
      for (const auto& rank : part.ranks) left.push_back(rank.rank);
      return true;
    });
    if (!left.empty())
      fmt::print(stderr, "lockstep-run: left out {}'s part{} in {}: {}\n", ranks_text(left),
                 left.size() == 1 ? "" : "s", dir, why);
  };
  leave_out([&](const Postmortem& part) { return part.attempt != attempt; },
            fmt::format("of another job or attempt than the last part's ({})",
                        attempt.empty() ? "which does not say its attempt" : attempt));
  // A part of a job of another size is another job's, whether or not its
  // launcher names jobs (MPICH's, a script do not).
  leave_out(
      [&](const Postmortem& part) {
        return world_size != 0 && part.world_size != 0 && part.world_size != world_size;
      },
      fmt::format("of a job of another size than the last part's ({} ranks)", world_size));
  double latest = 0;
  for (const auto& part : parts) latest = std::max(latest, part.written_unix_s);
  Postmortem pm{.written_unix_s = latest, .attempt = attempt};
  // Each part's cause with the ranks that gave it, in order of first rank.
  std::vector<std::pair<std::string, std::vector<int>>> causes;
  for (auto& part : parts) {
    // Every age as if measured when the last part was written.
    const double shift = part.written_unix_s > 0 ? latest - part.written_unix_s : 0;
    for (auto& rank : part.ranks) {
      for (auto& e : rank.entries) {
        e.started_s_ago += shift;
        if (e.ended_s_ago) *e.ended_s_ago += shift;
      }
    }
    pm.world_size = std::max(pm.world_size, part.world_size);
    auto cause = std::find_if(causes.begin(), causes.end(),
                              [&](const auto& c) { return c.first == part.cause; });
    if (cause == causes.end()) cause = causes.insert(causes.end(), {part.cause, {}});
    for (const auto& rank : part.ranks) cause->second.push_back(rank.rank);
    distributed::merge(pm, part);
  }
  // A part without a cause answered another rank's (rank_postmortem.h).
  std::erase_if(causes, [](const auto& c) { return c.second.empty() || c.first.empty(); });
  std::sort(causes.begin(), causes.end(), [](const auto& a, const auto& b) {
    return *std::min_element(a.second.begin(), a.second.end()) <
           *std::min_element(b.second.begin(), b.second.end());
  });
  for (const auto& [rank, why] : unreadable)
    distributed::merge(pm, Postmortem{.ranks = {RankHistory{.rank = rank, .no_record = why}}});
  // The ranks no part tells of, added at once (merge() looks through and
  // sorts every rank for each it adds).
  std::vector<bool> known(static_cast<size_t>(pm.world_size), false);
  for (const RankHistory& h : pm.ranks)
    if (h.rank >= 0 && h.rank < pm.world_size) known[static_cast<size_t>(h.rank)] = true;
  for (int r = 0; r < pm.world_size; ++r)
    if (!known[static_cast<size_t>(r)]) pm.ranks.push_back(RankHistory{.rank = r});
  std::sort(pm.ranks.begin(), pm.ranks.end(),
            [](const RankHistory& a, const RankHistory& b) { return a.rank < b.rank; });
  std::vector<std::string> said;
  for (const auto& [text, ranks] : causes)
    said.push_back(fmt::format("{} on {}", text, ranks_text(ranks)));
  pm.cause = said.empty() ? std::string("no part names a failed collective")
                         : fmt::format("{}", fmt::join(said, "; "));
  return pm;
}

void publish_report(const Postmortem& pm, const std::string& dir, const std::string& job_id,
                    int node, int attempt) {
  const std::string text = report_text(pm);
  if (text.empty()) return;
  std::string saved;
  if (!dir.empty()) {
    const auto path = std::filesystem::path(dir) /
                      fmt::format("lockstep-postmortem-{}-node{}-attempt{}.json", job_id, node,
                                  attempt);
    std::ofstream out(path);
    out << distributed::to_json_text(pm, 1) << "\n";
    out.close();
    saved = out ? fmt::format("  every rank's last collectives: {}\n", path.string())
                : fmt::format("  could not write {}: {}\n", path.string(), std::strerror(errno));
  }
  fmt::print(stderr, "lockstep-run: post-mortem of the collectives ({}):\n{}{}", pm.cause, text,
             saved);
}

}  // namespace lockstep::launcher
