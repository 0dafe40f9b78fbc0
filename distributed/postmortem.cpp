#include "lockstep/distributed/postmortem.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "lockstep/runtime/error.h"

namespace lockstep::distributed {
namespace {

double seconds_between(int64_t from_ns, int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e9;
}

}  // namespace

RankHistory rank_history(const std::vector<FlightRecord>& records, int64_t now_ns, int rank,
                         int node, const std::string& host, int64_t pid) {
  RankHistory h{.rank = rank, .node = node, .host = host, .pid = pid, .recorded = true};
  for (const auto& r : records) {
    if (r.state == FlightRecord::State::torn) {
      h.newest_torn = true;  // the newest only: nothing follows it
      continue;
    }
    PostmortemEntry e{.group = r.group,
                      .op = r.op,
                      .dtype = r.dtype,
                      .group_size = r.group_size,
                      .group_rank = r.group_rank,
                      .state = std::string(to_string(r.state)),
                      .seq = r.seq,
                      .count = r.count,
                      .root = r.root,
                      .started_s_ago = seconds_between(r.start_ns, now_ns)};
    if (r.end_ns != 0) e.ended_s_ago = seconds_between(r.end_ns, now_ns);
    h.entries.push_back(std::move(e));
  }
  return h;
}

std::string to_json_text(const Postmortem& pm, int indent) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : pm.ranks) {
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& e : r.entries) {
      nlohmann::json j = {{"group", e.group},   {"op", e.op},       {"seq", e.seq},
                          {"dtype", e.dtype},   {"count", e.count}, {"root", e.root},
                          {"state", e.state},   {"started_s_ago", e.started_s_ago}};
      j["ended_s_ago"] = e.ended_s_ago ? nlohmann::json(*e.ended_s_ago) : nlohmann::json();
      if (e.group_size > 0) {
        j["group_size"] = e.group_size;
        j["group_rank"] = e.group_rank;
      }
      entries.push_back(std::move(j));
    }
    ranks.push_back({{"rank", r.rank},         {"node", r.node},   {"host", r.host},
                     {"pid", r.pid},           {"recorded", r.recorded},
                     {"collectives", std::move(entries)}});
    if (!r.no_record.empty()) ranks.back()["no_record"] = r.no_record;
    if (r.newest_torn) ranks.back()["newest_record_torn"] = true;
    if (r.stopped) ranks.back()["stopped"] = true;
  }
  nlohmann::json doc = {{"cause", pm.cause}, {"ranks", std::move(ranks)}};
  if (pm.written_unix_s > 0) doc["written_unix_s"] = pm.written_unix_s;
  if (pm.world_size > 0) doc["world_size"] = pm.world_size;
  if (!pm.attempt.empty()) doc["attempt"] = pm.attempt;
  // Text that is not UTF-8 (a part written elsewhere) is kept with U+FFFD in
  // place of the bad bytes: the report is written whatever a name holds.
  return doc.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

Postmortem postmortem_from_json_text(std::string_view text) {
  try {
    const auto json = nlohmann::json::parse(text);
    Postmortem pm{.cause = json.at("cause").get<std::string>(),
                  .written_unix_s = json.value("written_unix_s", 0.0),
                  .world_size = json.value("world_size", 0),
                  .attempt = json.value("attempt", std::string())};
    for (const auto& r : json.at("ranks")) {
      RankHistory h{.rank = r.at("rank").get<int>(),
                    .node = r.at("node").get<int>(),
                    .host = r.at("host").get<std::string>(),
                    .pid = r.at("pid").get<int64_t>(),
                    .recorded = r.at("recorded").get<bool>(),
                    .no_record = r.value("no_record", std::string()),
                    .newest_torn = r.value("newest_record_torn", false),
                    .stopped = r.value("stopped", false)};
      for (const auto& j : r.at("collectives")) {
        PostmortemEntry e{.group = j.at("group").get<std::string>(),
                          .op = j.at("op").get<std::string>(),
                          .dtype = j.at("dtype").get<std::string>(),
                          .group_size = j.value("group_size", int32_t{0}),
                          .group_rank = j.value("group_rank", int32_t{-1}),
                          .state = j.at("state").get<std::string>(),
                          .seq = j.at("seq").get<uint64_t>(),
                          .count = j.at("count").get<int64_t>(),
                          .root = j.at("root").get<int32_t>(),
                          .started_s_ago = j.at("started_s_ago").get<double>()};
        if (!j.at("ended_s_ago").is_null()) e.ended_s_ago = j.at("ended_s_ago").get<double>();
        h.entries.push_back(std::move(e));
      }
      pm.ranks.push_back(std::move(h));
    }
    return pm;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("not a lockstep post-mortem: {}", e.what()));
  }
}

void merge(Postmortem& into, const Postmortem& other) {
  for (const auto& r : other.ranks) {
    const bool known = std::any_of(into.ranks.begin(), into.ranks.end(),
                                   [&](const RankHistory& h) { return h.rank == r.rank; });
    if (!known) into.ranks.push_back(r);
  }
  std::sort(into.ranks.begin(), into.ranks.end(),
            [](const RankHistory& a, const RankHistory& b) { return a.rank < b.rank; });
}

}  // namespace lockstep::distributed
