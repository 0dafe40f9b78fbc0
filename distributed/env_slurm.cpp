#include "lockstep/distributed/env_slurm.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/stable_hash.h"

namespace lockstep::distributed::slurm {
namespace {

bool parse_count(std::string_view text, int& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size() && value >= 0;
}

}  // namespace

std::string first_host(const std::string& nodelist, const std::string& what) {
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] == ']') break;
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    // A range set: keep its first number as written (zero padding included).
    const auto close = nodelist.find(']', i);
    LOCKSTEP_CHECK(close != std::string::npos,
                   "{}={} has a '[' without its ']'; is it a Slurm node list?", what,
                   runtime::quoted_value(nodelist));
    const std::string set = nodelist.substr(i + 1, close - i - 1);
    const std::string first = set.substr(0, set.find_first_of(",-"));
    LOCKSTEP_CHECK(!first.empty() && std::all_of(first.begin(), first.end(),
                                                 [](unsigned char c) { return std::isdigit(c); }),
                   "{}={} has a range '[{}]' that does not start with a number", what,
                   runtime::quoted_value(nodelist), set);
    host += first;
    i = close + 1;
  }
  LOCKSTEP_CHECK(!host.empty() && (i == nodelist.size() || nodelist[i] == ','),
                 "{}={} is not a Slurm node list (e.g. node[01-04],gpu5)", what,
                 runtime::quoted_value(nodelist));
  return host;
}

int tasks_on_node(const std::string& tasks_per_node, int node_index, const std::string& what) {
  // The whole list is checked, not only up to this node: every task reads it.
  int nodes = 0;
  int found = 0;
  size_t at = 0;
  while (at <= tasks_per_node.size()) {
    const auto comma = std::min(tasks_per_node.find(',', at), tasks_per_node.size());
    const std::string_view item(tasks_per_node.data() + at, comma - at);
    // "N" or "N(xM)": N tasks on each of M nodes.
    int tasks = 0;
    int repeat = 1;
    const auto paren = item.find("(x");
    const bool ok = paren == std::string_view::npos
                        ? parse_count(item, tasks)
                        : item.back() == ')' && parse_count(item.substr(0, paren), tasks) &&
                              parse_count(item.substr(paren + 2, item.size() - paren - 3), repeat);
    LOCKSTEP_CHECK(ok && tasks > 0 && repeat > 0,
                   "{}={} is not a Slurm tasks-per-node list (e.g. 2(x3),1)", what,
                   runtime::quoted_value(tasks_per_node));
    if (node_index >= nodes && node_index < nodes + repeat) found = tasks;
    nodes += repeat;
    at = comma + 1;
  }
  LOCKSTEP_CHECK(found > 0,
                 "{}={} lists {} nodes, but this task is on node {} (SLURM_NODEID); the Slurm "
                 "variables disagree",
                 what, runtime::quoted_value(tasks_per_node), nodes, node_index);
  return found;
}

int store_port(const std::string& job_id, const std::string& step_id) {
  return 20000 + static_cast<int>(runtime::stable_hash(job_id + "." + step_id) % 12000);
}

}  // namespace lockstep::distributed::slurm
