// The post-mortem report's text: each group's ranks by what they last did.
#include "launcher/postmortem.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace lockstep::launcher {

std::string ranks_text(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j >= i + 2) {
      parts.push_back(fmt::format("{}-{}", ranks[i], ranks[j]));
      i = j + 1;
    } else {
      parts.push_back(std::to_string(ranks[i++]));
    }
  }
  std::string list = parts.back();
  if (parts.size() > 1) {
    parts.pop_back();
    list = fmt::format("{} and {}", fmt::join(parts, ", "), list);
  }
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", list);
}

namespace {

std::string verb(const std::vector<int>& ranks, const char* one, const char* many) {
  return ranks.size() == 1 ? one : many;
}

// "allreduce #12 (f32, 1000 elements)", "broadcast #3 (i64, 2 elements, root 1)",
// "barrier #5".
std::string call_text(const PostmortemEntry& e) {
  if (e.dtype.empty()) return fmt::format("{} #{}", e.op, e.seq);
  return fmt::format("{} #{} ({}, {} element{}{})", e.op, e.seq, e.dtype, e.count,
                     e.count == 1 ? "" : "s",
                     e.root >= 0 ? fmt::format(", root {}", e.root) : std::string());
}

// The last collective of `group` each rank issued (nullptr: none).
const PostmortemEntry* last_of(const RankHistory& rank, const std::string& group) {
  const PostmortemEntry* last = nullptr;
  for (const auto& e : rank.entries)
    if (e.group == group && e.seq > 0) last = &e;
  return last;
}

// A send or recv of `group` the rank issued after `last` (all of them when
// null), the newest (nullptr: none). They are not numbered, so they do not
// order the ranks, but a rank waiting in one is not idle.
const PostmortemEntry* point_to_point_after(const RankHistory& rank, const std::string& group,
                                            const PostmortemEntry* last) {
  const PostmortemEntry* newest = nullptr;
  for (const auto& e : rank.entries)
    if (e.group == group && e.seq == 0 && (last == nullptr || &e > last)) newest = &e;
  return newest;
}

// How long ago a call ended, or since when it runs. An ended call without its
// end time (another node's part may lack it) counts from its start.
double age_of(const PostmortemEntry& e) {
  return e.state == "running" ? e.started_s_ago : e.ended_s_ago.value_or(e.started_s_ago);
}

// "in recv (f32, 10 elements, peer 1) since 3.0 s", "send (...) failed 1.0 s ago".
std::string point_to_point_text(const PostmortemEntry& e, double age) {
  const std::string call = fmt::format("{} ({}, {} element{}, peer {})", e.op, e.dtype, e.count,
                                       e.count == 1 ? "" : "s", e.root);
  if (e.state == "running") return fmt::format("in {} since {:.1f} s", call, age);
  if (e.state == "failed") return fmt::format("{} failed {:.1f} s ago", call, age);
  return fmt::format("finished {} {:.1f} s ago", call, age);
}

// "the newest collective of rank 1 is unknown: ...": ranks whose newest
// record was still being written when read.
std::string unknown_text(const std::vector<int>& ranks) {
  return fmt::format("the newest {} of {} {} unknown: {} {} still being written when read",
                     verb(ranks, "collective", "collectives"), ranks_text(ranks),
                     verb(ranks, "is", "are"), verb(ranks, "its record", "their records"),
                     verb(ranks, "was", "were"));
}

// The ranks of `group`: those with a record of it, and those without whose
// membership follows from its size; `unplaced` more of its ranks issued none
// of its calls or left no record, but which of `candidates` they are is not
// known. A group of unknown size (an older part) takes in every rank.
struct Members {
  std::vector<const RankHistory*> ranks;
  int size = 0;  // 0: not known
  int unplaced = 0;
  std::vector<int> candidates;
};

Members members_of(const Postmortem& pm, const std::string& group) {
  Members m;
  std::vector<const RankHistory*> others;
  for (const auto& r : pm.ranks) {
    bool seen = false;
    for (const auto& e : r.entries) {
      if (e.group != group) continue;
      seen = true;
      m.size = std::max(m.size, static_cast<int>(e.group_size));
    }
    (seen ? m.ranks : others).push_back(&r);
  }
  const int missing = m.size - static_cast<int>(m.ranks.size());
  if (m.size == 0 || missing >= static_cast<int>(others.size())) {
    // Every rank without a record of it is one of its ranks.
    m.ranks.insert(m.ranks.end(), others.begin(), others.end());
    m.unplaced = m.size == 0 ? 0 : missing - static_cast<int>(others.size());
  } else if (missing > 0) {
    m.unplaced = missing;
    for (const RankHistory* r : others) m.candidates.push_back(r->rank);
  }
  std::sort(m.ranks.begin(), m.ranks.end(),
            [](const RankHistory* a, const RankHistory* b) { return a->rank < b->rank; });
  return m;
}

// "2 more of its 4 ranks" (`more`: after ranks named), "1 of its 4 ranks".
std::string unplaced_text(const Members& m, bool more) {
  return fmt::format("{}{} of its {} ranks", m.unplaced, more ? " more" : "", m.size);
}

// Why the unplaced ranks say nothing, and which ranks they may be.
std::string unplaced_why(const Members& m) {
  std::string why = "issued none of its collectives or left no record";
  if (!m.candidates.empty()) {
    const std::string how_many = m.unplaced == 1 ? "one" : std::to_string(m.unplaced);
    why += fmt::format(" ({} of {}, not known which)", how_many, ranks_text(m.candidates));
  }
  return why;
}

// (seq, state, call_text) of a rank's last collective: ranks that gave one
// number to different calls (the mismatch the call check fails) differ.
using Key = std::tuple<uint64_t, std::string, std::string>;
constexpr std::string_view kNothingSince = "; nothing since";

// The group's line after its name: who is behind, and where the others are.
std::string headline_of(const std::map<Key, std::vector<int>>& classes,
                        const std::map<Key, const PostmortemEntry*>& example, uint64_t newest,
                        const Members& members, const std::vector<int>& in_p2p,
                        const std::vector<int>& stopped) {
  // A torn rank is neither behind nor ahead: its newest call is unknown.
  std::vector<int> behind, ahead, unknown, torn_at_newest;
  const auto* front_key = &classes.rbegin()->first;
  for (const auto& [key, ranks] : classes) {
    const bool torn = std::get<1>(key).starts_with("torn ");
    if (torn && std::get<0>(key) == newest) {
      torn_at_newest.insert(torn_at_newest.end(), ranks.begin(), ranks.end());
    }
    auto& into = torn ? unknown : std::get<0>(key) < newest ? behind : ahead;
    into.insert(into.end(), ranks.begin(), ranks.end());
    if (!torn && std::get<0>(key) == newest) front_key = &key;
  }
  // Only torn ranks reached the newest call: they did, at least.
  if (ahead.empty()) ahead = torn_at_newest;
  std::string headline;
  // Ranks that numbered different calls alike: which rank issued which.
  std::map<std::string, std::vector<int>> calls_at_newest;
  for (const auto& [key, ranks] : classes) {
    if (std::get<0>(key) != newest || std::get<1>(key).starts_with("torn ")) continue;
    auto& into = calls_at_newest[std::get<2>(key)];
    into.insert(into.end(), ranks.begin(), ranks.end());
  }
  if (calls_at_newest.size() > 1) {
    std::map<int, std::string> calls;  // by each call's lowest rank
    for (auto& [call, ranks] : calls_at_newest) {
      const int lowest = *std::min_element(ranks.begin(), ranks.end());
      calls[lowest] = fmt::format("{} issued {}", ranks_text(ranks), call);
    }
    std::vector<std::string> texts;
    for (const auto& [lowest, text] : calls) texts.push_back(text);
    headline = fmt::format("collective #{} differs across the ranks: {}", newest,
                           fmt::join(texts, "; "));
    if (!behind.empty())
      headline += fmt::format("; {} {} behind", ranks_text(behind), verb(behind, "is", "are"));
    if (members.unplaced > 0)
      headline += fmt::format("; {} {} behind", unplaced_text(members, !behind.empty()),
                              members.unplaced == 1 ? "is" : "are");
    if (!unknown.empty()) headline += "; " + unknown_text(unknown);
    return headline;
  }
  const PostmortemEntry* front = example.at(*front_key);
  const bool waiting = front->state == "running" && !std::get<1>(*front_key).starts_with("torn");
  if (!behind.empty() || !unknown.empty() || members.unplaced > 0) {
    if (!behind.empty() && members.unplaced > 0) {
      headline = fmt::format("{} and {} are behind: ", ranks_text(behind),
                             unplaced_text(members, true));
    } else if (members.unplaced > 0) {
      headline = fmt::format("{} {} behind: ", unplaced_text(members, false),
                             members.unplaced == 1 ? "is" : "are");
    } else if (!behind.empty()) {
      headline = fmt::format("{} {} behind: ", ranks_text(behind), verb(behind, "is", "are"));
    }
    headline += fmt::format("{} {} {} {}", ranks_text(ahead), verb(ahead, "has", "have"),
                            waiting ? "reached, and wait in," : "reached", call_text(*front));
    if (!unknown.empty()) headline += "; " + unknown_text(unknown);
  } else if (classes.size() == 1 && front->state == "running" && !stopped.empty() &&
             stopped.size() < classes.begin()->second.size()) {
    // A rank stopped inside the call holds the others in it: not the call's fault.
    std::vector<int> waiting_ranks;
    for (int rank : classes.begin()->second)
      if (std::find(stopped.begin(), stopped.end(), rank) == stopped.end())
        waiting_ranks.push_back(rank);
    headline = fmt::format("{} {} stopped (SIGSTOP, a debugger) in {}, in which {} {} for {}",
                           ranks_text(stopped), verb(stopped, "is", "are"), call_text(*front),
                           ranks_text(waiting_ranks), verb(waiting_ranks, "waits", "wait"),
                           verb(stopped, "it", "them"));
  } else if (classes.size() == 1 && front->state == "running") {
    headline = fmt::format("every rank is in {}: all issued it; it did not complete",
                           call_text(*front));
  } else if (classes.size() == 1 && front->state == "failed") {
    headline = fmt::format("every rank issued {}; it failed on every rank", call_text(*front));
  } else if (classes.size() == 1 && front->state == "finished" && in_p2p.empty()) {
    headline = fmt::format("every rank finished {}; none was in a collective of this group",
                           call_text(*front));
  } else if (classes.size() == 1 && front->state == "finished") {
    headline = fmt::format("every rank finished {}; since, {} {} in a send or recv of this group",
                           call_text(*front), ranks_text(in_p2p), verb(in_p2p, "is", "are"));
  } else {
    headline = fmt::format("every rank issued {}; they ended it differently", call_text(*front));
  }
  return headline;
}

// What the ranks of class `key` last did in the group.
std::string line_text(const Key& key, const std::vector<int>& ranks,
                      const std::map<Key, const PostmortemEntry*>& example,
                      const std::map<Key, double>& oldest, std::string_view no_record) {
  std::string state = std::get<1>(key);
  std::string what;
  const bool torn = state.starts_with("torn ");
  if (torn) {
    state = state.substr(std::string_view("torn ").size());
    what = fmt::format("newest collective unknown ({} still being written when read); ",
                       verb(ranks, "its record was", "their records were"));
    if (state == "none") return what + "none of this group before it";
    what += "before it: ";
  }
  if (state.starts_with("unrecorded")) {
    const std::string why = state.substr(std::string_view("unrecorded").size());
    return fmt::format("left no record ({})", why.empty() ? std::string(no_record) : why);
  }
  if (state == "none") return "issued no collective on this group";
  const PostmortemEntry& e = *example.at(key);
  const double age = oldest.at(key);
  if (state == "running") return what + fmt::format("in {} since {:.1f} s", call_text(e), age);
  if (state == "failed") return what + fmt::format("{} failed {:.1f} s ago", call_text(e), age);
  return what + fmt::format("finished {} {:.1f} s ago{}", call_text(e), age,
                            torn ? std::string_view() : kNothingSince);
}

void report_group(std::string& out, const Postmortem& pm, const std::string& group,
                  std::string_view no_record) {
  // Ranks not in the group (a member group of shm+gloo's, a group made on
  // some of the ranks) are left out: they are not behind in it.
  const Members members = members_of(pm, group);
  // Ranks by what they last did: (seq, state) -> ranks; seq 0: nothing. A
  // rank whose newest record is torn has "torn " before its state: its last
  // call of this group may be later than the one known.
  std::map<Key, std::vector<int>> classes;
  std::map<Key, const PostmortemEntry*> example;
  std::map<Key, double> oldest;
  // The report's lines: a class split by the send or recv its ranks issued
  // after their last collective ("": none), and by whether they are stopped.
  using LineKey = std::tuple<uint64_t, std::string, std::string, bool, std::string>;
  std::map<LineKey, std::vector<int>> lines;
  std::map<LineKey, const PostmortemEntry*> p2p_example;
  std::map<LineKey, double> p2p_oldest;
  std::vector<int> in_p2p;  // ranks waiting in a send or recv of the group
  std::vector<int> stopped;  // ranks whose process was stopped when read
  uint64_t newest = 0;
  for (const RankHistory* member : members.ranks) {
    const RankHistory& r = *member;
    const PostmortemEntry* last = last_of(r, group);
    // Unrecorded ranks are told apart by why they left no record.
    Key key = last ? std::make_tuple(last->seq, last->state, call_text(*last))
                   : std::make_tuple(uint64_t{0},
                                     r.recorded ? std::string("none") : "unrecorded" + r.no_record,
                                     std::string());
    if (r.newest_torn) std::get<1>(key) = "torn " + std::get<1>(key);
    classes[key].push_back(r.rank);
    const PostmortemEntry* p2p = point_to_point_after(r, group, last);
    const LineKey line{std::get<0>(key), std::get<1>(key),
                       p2p ? point_to_point_text(*p2p, 0) : std::string(), r.stopped,
                       std::get<2>(key)};
    lines[line].push_back(r.rank);
    if (r.stopped) stopped.push_back(r.rank);
    if (p2p) {
      p2p_example[line] = p2p;
      p2p_oldest[line] = std::max(p2p_oldest[line], age_of(*p2p));
      if (p2p->state == "running") in_p2p.push_back(r.rank);
    }
    if (!last) continue;
    example[key] = last;
    oldest[key] = std::max(oldest[key], age_of(*last));
    newest = std::max(newest, last->seq);
  }

  out += fmt::format("  group '{}': {}\n", group,
                     newest == 0 ? "only sends and receives, which are not numbered"
                                 : headline_of(classes, example, newest, members, in_p2p,
                                               stopped));
  for (const auto& [line, ranks] : lines) {
    const Key key{std::get<0>(line), std::get<1>(line), std::get<4>(line)};
    std::string what = line_text(key, ranks, example, oldest, no_record);
    if (const auto p2p = p2p_example.find(line); p2p != p2p_example.end()) {
      const std::string since = point_to_point_text(*p2p->second, p2p_oldest.at(line));
      if (what.ends_with(kNothingSince)) {
        what.replace(what.size() - kNothingSince.size(), kNothingSince.size(),
                     "; since: " + since);
      } else if (std::get<1>(key) == "none") {
        what = since;
      } else {
        what += "; then " + since;
      }
    }
    if (std::get<3>(line)) what += "; stopped (SIGSTOP, a debugger)";
    out += fmt::format("    {}: {}\n", ranks_text(ranks), what);
  }
  if (members.unplaced > 0) {
    out += fmt::format("    {}: {}\n", unplaced_text(members, !members.ranks.empty()),
                       unplaced_why(members));
  }
}

}  // namespace

std::string report_text(const Postmortem& pm, std::string_view no_record) {
  std::set<std::string> groups;
  for (const auto& r : pm.ranks)
    for (const auto& e : r.entries) groups.insert(e.group);
  if (groups.empty()) return "";
  std::string out;
  // The default group first: the one a training step's collectives use.
  if (groups.count("default")) report_group(out, pm, "default", no_record);
  for (const auto& g : groups)
    if (g != "default") report_group(out, pm, g, no_record);
  return out;
}

}  // namespace lockstep::launcher
