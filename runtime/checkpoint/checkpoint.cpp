#include "lockstep/runtime/checkpoint/checkpoint.h"

#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/runtime/checkpoint/name_insertion.h"


namespace lockstep::runtime {

uint64_t save_checkpoint(const std::filesystem::path& path, const CheckpointContent& content,
                         const SaveOptions& options) {
  return write_safetensors(path, content.tensors, content.metadata,
                           {.on_progress = options.on_progress});
}

CheckpointContent load_checkpoint(const std::filesystem::path& path, const LoadOptions& options) {
  SafetensorsFile file =
      read_safetensors(path.string(), {.require_checksum = options.require_checksum});
  file.metadata.erase(kChecksumKey);
  file.metadata.erase(kTensorChecksumsKey);
  CheckpointContent out{.tensors = std::move(file.tensors), .metadata = std::move(file.metadata)};
  if (!options.device.is_cpu())
    for (auto& [name, t] : out.tensors) t = t.to(options.device);
  return out;
}

void check_tensors_match(const NamedTensors& found, const NamedTensors& expected,
                         const std::string& file) {
  // Long lists are cut: the first few differences say what happened.
  constexpr size_t kMaxListed = 8;
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : found) by_name[name] = &t;

  std::vector<std::string> missing, mismatched;
  // The file's dtypes where only dtypes differ (a model converted after the save).
  std::set<std::string> saved_dtypes;
  bool only_dtypes = true;
  for (const auto& [name, want] : expected) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& got = *it->second;
    if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
      only_dtypes = only_dtypes && got.shape() == want.shape();
      saved_dtypes.emplace(dtype_name(got.dtype()));
      mismatched.push_back(fmt::format("'{}': expected {} {}, found {} {}", name,
                                       dtype_name(want.dtype()), shape_str(want.shape()),
                                       dtype_name(got.dtype()), shape_str(got.shape())));
    }
    by_name.erase(it);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : found)
    if (by_name.count(name)) unexpected.push_back(name);
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return;
  const auto insertion = name_insertion(missing, unexpected);

  auto list = [&](const std::vector<std::string>& items, bool quote = true) {
    std::string s;
    for (size_t i = 0; i < items.size() && i < kMaxListed; ++i)
      s += (i ? ", " : "") + (quote ? "'" + items[i] + "'" : items[i]);
    if (items.size() > kMaxListed) s += fmt::format(", ... ({} in all)", items.size());
    return s;
  };
  std::string msg = fmt::format("{} does not match the expected tensors:", file);
  if (!mismatched.empty())
    msg += fmt::format("\n  shape or dtype differs: {}", list(mismatched, false));
  if (!missing.empty()) msg += fmt::format("\n  missing from the file: {}", list(missing));
  if (!unexpected.empty())
    msg += fmt::format("\n  in the file but not expected: {}", list(unexpected));
  if (insertion && insertion->segment == "module.") {
    msg += insertion->in_found
               ? "\nThe checkpoint was saved from a model wrapped in DistributedDataParallel or "
                 "DataParallel (its names have \"module.\" in them): load it into the same "
                 "wrapper, or save the wrapper's module() instead."
               : "\nThe model being loaded is wrapped in DistributedDataParallel or DataParallel, "
                 "and the checkpoint was saved from the bare model: load it into the wrapper's "
                 "module().";
  } else if (insertion) {
    msg += fmt::format(
        "\nThe {} names are the {} ones with \"{}\" {}{}: the same model, saved or loaded "
        "inside another one, or under another name.",
        insertion->in_found ? "file's" : "expected", insertion->in_found ? "expected" : "file's",
        insertion->segment,
        insertion->head.empty() ? "in front" : fmt::format("after \"{}\"", insertion->head),
        insertion->count == insertion->of
            ? ""
            : fmt::format(" ({} of the {})", insertion->count, insertion->of));
  } else if (only_dtypes && missing.empty() && unexpected.empty()) {
    msg += fmt::format(
        "\nOnly dtypes differ: the checkpoint was saved from the model in {}. Convert the model "
        "to the dtype it was saved in (Module::to) before loading, and convert it afterwards if "
        "you want another.",
        fmt::join(saved_dtypes, " and "));
  } else {
    msg +=
        "\nThe checkpoint was written for a different model or configuration: build the model "
        "the way the run that saved it did, or pick the matching checkpoint.";
  }
  throw Error(msg);
}

}  // namespace lockstep::runtime
