#include "lockstep/collectives/build_identity.h"

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/backends.h"
#include "lockstep/config.h"
#include "lockstep/distributed/wire_protocol.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives {
namespace {

constexpr std::string_view kPrefix = "lockstep/";

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t end; (end = text.find(separator, start)) != std::string::npos; start = end + 1)
    parts.push_back(text.substr(start, end - start));
  parts.push_back(text.substr(start));
  return parts;
}

// What must be equal: the wire protocol, and the backends built in where
// they choose the default. A build that does not parse is itself.
std::string must_match(const std::string& build, bool compare_backends) {
  if (!is_build(build)) return build;
  const std::vector<std::string> parts = split(build.substr(kPrefix.size()), '/');
  if (parts.size() != 3) return build;
  return compare_backends ? parts[1] + "/" + parts[2] : parts[1];
}

}  // namespace

std::string this_build() {
  return fmt::format("{}{}/wire{}/{}", kPrefix, LOCKSTEP_VERSION_STRING,
                     distributed::kWireProtocol, fmt::join(built_in_backends(), ","));
}

bool is_build(const std::string& word) { return word.starts_with(kPrefix); }

std::string describe_build(const std::string& build) {
  if (build.empty())
    return "a lockstep from before wire protocol 1 (one that does not say its version)";
  const std::vector<std::string> parts = split(build.substr(kPrefix.size()), '/');
  if (parts.size() != 3 || !parts[1].starts_with("wire")) return fmt::format("'{}'", build);
  return fmt::format("lockstep {} wire {} ({})", parts[0], parts[1].substr(4),
                     fmt::join(split(parts[2], ','), ", "));
}

void require_same_build(const std::vector<std::string>& builds,
                        const std::vector<std::string>& nodes, const std::string& group,
                        bool compare_backends) {
  LOCKSTEP_CHECK(!builds.empty() && builds.size() == nodes.size(),
                 "require_same_build: {} builds for {} nodes", builds.size(), nodes.size());
  const std::string first = must_match(builds.front(), compare_backends);
  if (std::all_of(builds.begin(), builds.end(), [&](const std::string& b) {
        return must_match(b, compare_backends) == first;
      }))
    return;
  // Each build, in order of its lowest rank, with its ranks and their nodes.
  struct Users {
    std::string build;
    std::vector<int> ranks;
    std::vector<std::string> nodes;
  };
  std::vector<Users> by_build;
  for (int r = 0; r < static_cast<int>(builds.size()); ++r) {
    const auto i = static_cast<size_t>(r);
    auto it = std::find_if(by_build.begin(), by_build.end(),
                           [&](const Users& u) { return u.build == builds[i]; });
    if (it == by_build.end()) it = by_build.insert(by_build.end(), Users{builds[i], {}, {}});
    it->ranks.push_back(r);
    if (std::find(it->nodes.begin(), it->nodes.end(), nodes[i]) == it->nodes.end())
      it->nodes.push_back(nodes[i]);
  }
  std::vector<std::string> parts;
  for (const Users& u : by_build) {
    const bool one = u.ranks.size() == 1;
    parts.push_back(fmt::format("{} {} (node{} {}) run{} {}", one ? "rank" : "ranks",
                                fmt::join(u.ranks, ", "), u.nodes.size() == 1 ? "" : "s",
                                fmt::join(u.nodes, ", "), one ? "s" : "", describe_build(u.build)));
  }
  throw Error(fmt::format(
      "group '{}': its ranks run builds of lockstep that cannot be paired ({}): {}. Run the "
      "same build on every node, and start the ranks with that build's lockstep-run",
      group,
      compare_backends ? "another wire protocol, or other backends built in where the default "
                         "backend is chosen"
                       : "another wire protocol",
      fmt::join(parts, "; ")));
}

}  // namespace lockstep::collectives
