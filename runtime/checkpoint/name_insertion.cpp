#include "lockstep/runtime/checkpoint/name_insertion.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace lockstep::runtime {
namespace {

// Counts, for each (head, segment) of a name in `longer` whose removal leaves
// a name in `shorter`, the names it pairs up; keeps the best in `best`.
void count_insertions(const std::vector<std::string>& longer,
                      const std::vector<std::string>& shorter, bool in_found, bool front_only,
                      NameInsertion& best, bool& tied) {
  const std::unordered_set<std::string_view> rest(shorter.begin(), shorter.end());
  std::map<std::pair<std::string_view, std::string_view>, size_t> counts;
  std::string without;
  for (const std::string_view name : longer) {
    // Segments start at the front or after a dot and end with a dot.
    for (size_t start = 0; start < name.size(); start = name.find('.', start) + 1) {
      for (size_t dot = name.find('.', start);
           dot != std::string_view::npos && dot + 1 < name.size(); dot = name.find('.', dot + 1)) {
        without.assign(name.substr(0, start));
        without.append(name.substr(dot + 1));
        if (rest.contains(without))
          ++counts[{name.substr(0, start), name.substr(start, dot + 1 - start)}];
      }
      if (front_only || name.find('.', start) == std::string_view::npos) break;
    }
  }
  for (const auto& [where, count] : counts) {
    if (count > best.count) {
      best = {std::string(where.first), std::string(where.second), in_found, count,
              shorter.size()};
      tied = false;
    } else if (count == best.count) {
      tied = true;
    }
  }
}

}  // namespace

std::optional<NameInsertion> name_insertion(const std::vector<std::string>& missing,
                                            const std::vector<std::string>& unexpected,
                                            bool front_only) {
  if (missing.empty() || unexpected.empty()) return std::nullopt;
  NameInsertion best;
  bool tied = false;
  count_insertions(unexpected, missing, /*in_found=*/true, front_only, best, tied);
  count_insertions(missing, unexpected, /*in_found=*/false, front_only, best, tied);
  // All of one side, or at least half of the smaller one (Hugging Face's
  // GPT-2 also holds buffers this model does not have).
  if (tied || best.count == 0 ||
      (best.count < best.of && 2 * best.count < std::min(missing.size(), unexpected.size())))
    return std::nullopt;
  return best;
}

}  // namespace lockstep::runtime
