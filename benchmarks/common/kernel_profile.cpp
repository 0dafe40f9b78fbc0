#include "common/kernel_profile.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "common/device.h"
#include "harness.h"
#include "lockstep/runtime/error.h"

namespace lockstep::bench {

namespace {

constexpr size_t kNameWidth = 60;

std::string cut(std::string s, size_t width = kNameWidth) {
  if (s.size() > width) s = s.substr(0, width - 3) + "...";
  return s;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// `s` without what its top-level <...> enclose, cut at the parameter list's
// '(' (the first one outside angle brackets); the first template argument
// goes to `first_arg`.
std::string strip_templates(const std::string& s, std::string& first_arg) {
  std::string out;
  int depth = 0;
  bool in_first = false;
  for (char c : s) {
    if (c == '<') {
      if (depth == 0) in_first = first_arg.empty();
      ++depth;
      continue;
    }
    if (c == '>' && depth > 0) {
      --depth;
      if (depth == 0) in_first = false;
      continue;
    }
    if (depth == 0) {
      if (c == '(') break;
      out += c;
    } else if (in_first) {
      if (depth == 1 && c == ',') {
        in_first = false;
      } else {
        first_arg += c;
      }
    }
  }
  return out;
}

}  // namespace

std::string short_kernel_name(const std::string& name) {
  if (name.rfind("Memcpy", 0) == 0 || name.rfind("Memset", 0) == 0)
    return cut(name.substr(0, name.find(" (")));  // Kineto adds "(Device -> Pageable)"
  std::string s = name;
  replace_all(s, "(anonymous namespace)", "anonymous");
  std::string first_arg;
  s = strip_templates(s, first_arg);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (size_t space = s.rfind(' '); space != std::string::npos) s = s.substr(space + 1);
  if (size_t scope = s.rfind("::"); scope != std::string::npos) s = s.substr(scope + 2);
  // CUTLASS's and CUB's kernels are named by their first template argument.
  static const std::regex generic("(device_)?kernel\\d*", std::regex::icase);
  if (std::regex_match(s, generic) && !first_arg.empty()) {
    std::string arg = first_arg;
    while (!arg.empty() && arg.front() == ' ') arg.erase(arg.begin());
    if (size_t scope = arg.rfind("::"); scope != std::string::npos) arg = arg.substr(scope + 2);
    s += "<" + arg + ">";
  }
  return cut(s.empty() ? name : s);
}

std::string kernel_category(const std::string& name) {
  static const std::vector<std::pair<std::string, std::regex>> rules = [] {
    std::vector<std::pair<std::string, std::regex>> r;
    auto add = [&](const char* category, const char* pattern) {
      r.emplace_back(category, std::regex(pattern));
    };
    add("collective", "nccl");
    add("copy", "^memcpy|^memset|copy");
    add("conv", "conv|fprop|dgrad|wgrad|winograd|implicit_gemm|im2col|col2im");
    add("gemm", "gemm|cutlass|cublas|matmul|splitk");
    add("norm",
        "norm|bn_fw|bn_bw|welford|channel_partials|channel_stats|channel_map|channel_grad");
    add("softmax/loss", "softmax|cross_entropy|nll_loss|loss");
    add("pool", "pool");
    add("optimizer", "sgd|adam|multi_tensor|foreach|unscale|update_scale");
    add("reduce", "reduce|sum|mean|argmax");
    add("elementwise",
        "elementwise|map1|map2|fill|relu|gelu|add|mul|dropout|embedding|vectorized|unrolled");
    return r;
  }();
  const std::string low = lower(name);
  for (const auto& [category, pattern] : rules) {
    if (std::regex_search(low, pattern)) return category;
  }
  return "other";
}

KernelProfile summarize_activities(const std::vector<runtime::DeviceActivity>& activities,
                                   int steps) {
  KernelProfile p;
  p.steps = steps;
  p.activities = static_cast<int64_t>(activities.size());
  std::map<std::string, KernelStat> by_name;
  std::vector<std::pair<double, double>> spans;
  for (const runtime::DeviceActivity& a : activities) {
    const double length = std::max(0.0, a.end_us - a.start_us);
    p.sum_us += length;
    spans.emplace_back(a.start_us, std::max(a.start_us, a.end_us));
    KernelStat& k = by_name[short_kernel_name(a.name)];
    if (k.calls == 0) k.name = short_kernel_name(a.name);
    ++k.calls;
    k.total_us += length;
  }
  // Busy time: the union of the intervals (kernels on several streams overlap).
  std::sort(spans.begin(), spans.end());
  double open_from = 0, open_to = -1;
  for (const auto& [from, to] : spans) {
    if (from > open_to) {
      if (open_to > open_from) p.busy_us += open_to - open_from;
      open_from = from;
      open_to = to;
    } else {
      open_to = std::max(open_to, to);
    }
  }
  if (open_to > open_from) p.busy_us += open_to - open_from;
  for (auto& [name, k] : by_name) p.kernels.push_back(std::move(k));
  std::sort(p.kernels.begin(), p.kernels.end(), [](const KernelStat& a, const KernelStat& b) {
    return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
  });
  return p;
}

void check_kernel_trace(int steps, const runtime::Device& device) {
  if (steps == 0) return;
  LOCKSTEP_CHECK(device.is_cuda(), "--kernel-trace needs --device cuda: it traces the GPU's kernels");
  runtime::device_backend(device).trace_activity()->stop();
}

KernelProfile trace_steps(const runtime::Device& device, int steps,
                          const std::function<void()>& step) {
  auto trace = runtime::device_backend(device).trace_activity();
  for (int i = 0; i < steps; ++i) step();
  synchronize(device);
  return summarize_activities(trace->stop(), steps);
}

std::vector<runtime::DeviceActivity> activities_from_json(const nlohmann::json& list) {
  std::vector<runtime::DeviceActivity> out;
  if (!list.is_array()) return out;
  for (const auto& a : list) {
    if (!a.is_array() || a.size() != 3 || !a[0].is_string() || !a[1].is_number() ||
        !a[2].is_number())
      continue;
    out.push_back({a[0].get<std::string>(), a[1].get<double>(), a[2].get<double>()});
  }
  return out;
}

std::vector<std::pair<std::string, double>> category_us_per_step(const KernelProfile& profile) {
  std::map<std::string, double> total;
  // Categorised by the short name: the same name always lands in one place.
  for (const KernelStat& k : profile.kernels) total[kernel_category(k.name)] += k.total_us;
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [category, us] : total) out.emplace_back(category, profile.per_step(us));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

nlohmann::json KernelProfile::to_json(int top) const {
  nlohmann::json categories = nlohmann::json::object();
  for (const auto& [category, us] : category_us_per_step(*this)) categories[category] = us;
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < kernels.size() && static_cast<int>(i) < top; ++i) {
    list.push_back({{"name", kernels[i].name},
                    {"calls_per_step", static_cast<double>(kernels[i].calls) / std::max(1, steps)},
                    {"us_per_step", per_step(kernels[i].total_us)}});
  }
  return {{"steps_traced", steps},
          {"launches_per_step", static_cast<double>(activities) / std::max(1, steps)},
          {"busy_us_per_step", per_step(busy_us)},
          {"kernel_us_per_step", per_step(sum_us)},
          {"us_per_step_by_category", categories},
          {"top_kernels", list}};
}

std::string compare_profiles(const std::string& title, const ProfiledSide& a,
                             const std::optional<ProfiledSide>& b, int top) {
  auto us = [](double v) { return fmt::format("{:.0f}", v); };
  auto launches = [](const KernelProfile& p) {
    return fmt::format("{:.1f}", static_cast<double>(p.activities) / std::max(1, p.steps));
  };
  std::map<std::string, std::pair<double, double>> categories;
  for (const auto& [c, v] : category_us_per_step(a.profile)) categories[c].first = v;
  if (b) {
    for (const auto& [c, v] : category_us_per_step(b->profile)) categories[c].second = v;
  }
  std::vector<std::pair<std::string, std::pair<double, double>>> ordered(categories.begin(),
                                                                         categories.end());
  std::sort(ordered.begin(), ordered.end(), [](const auto& x, const auto& y) {
    return std::max(x.second.first, x.second.second) > std::max(y.second.first, y.second.second);
  });
  std::vector<std::vector<std::string>> rows;
  auto row = [&](const std::string& what, const std::string& mine, const std::string& theirs) {
    rows.push_back(b ? std::vector<std::string>{what, mine, theirs}
                     : std::vector<std::string>{what, mine});
  };
  auto wall = [&](const std::optional<double>& ms) { return ms ? us(*ms * 1e3) : "-"; };
  const KernelProfile& pa = a.profile;
  for (const auto& [c, v] : ordered) row(c + " us", us(v.first), us(v.second));
  row("all kernels us (sum)", us(pa.per_step(pa.sum_us)),
      b ? us(b->profile.per_step(b->profile.sum_us)) : "");
  row("GPU busy us (union)", us(pa.per_step(pa.busy_us)),
      b ? us(b->profile.per_step(b->profile.busy_us)) : "");
  row("step wall us", wall(a.wall_ms), b ? wall(b->wall_ms) : "");
  row("launches", launches(pa), b ? launches(b->profile) : "");
  std::vector<std::string> header{"per step", a.name};
  if (b) header.push_back(b->name);
  std::string out = fmt::format("{} ({} steps traced)\n", title, pa.steps);
  out += format_table(header, rows);

  std::vector<std::vector<std::string>> top_rows;
  auto add_top = [&](const ProfiledSide& side) {
    const KernelProfile& p = side.profile;
    for (size_t i = 0; i < p.kernels.size() && static_cast<int>(i) < top; ++i) {
      const KernelStat& k = p.kernels[i];
      top_rows.push_back({side.name, k.name, kernel_category(k.name),
                          fmt::format("{:.1f}", static_cast<double>(k.calls) / std::max(1, p.steps)),
                          us(p.per_step(k.total_us))});
    }
  };
  add_top(a);
  if (b) add_top(*b);
  out += format_table({"side", "kernel", "kind", "calls/step", "us/step"}, top_rows);
  return out;
}

}  // namespace lockstep::bench
