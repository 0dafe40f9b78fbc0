#include "lockstep/distributed/device_select.h"

#include <charconv>
#include <cstdio>
#include <mutex>

#include <fmt/format.h>

#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

namespace lockstep::distributed {
namespace {

std::mutex selected_mutex;
std::optional<runtime::Device> selected;

// The request as its user wrote it: "--device cuda", "LOCKSTEP_DEVICE=cuda".
std::string written(const std::string& origin, const std::string& text) {
  return fmt::format("{}{}{}", origin, origin.starts_with("-") ? " " : "=", text);
}

// Why no GPU can be used, as an error naming the request.
[[noreturn]] void throw_no_gpu(const DeviceRequest& r, const DeviceContext& c) {
  const std::string asked = written(r.origin, r.text);
  const std::string instead = written(r.origin, "cpu");
  if (!c.gpus.cuda_built)
    throw Error(fmt::format("{}: this build of lockstep has no CUDA (configure with "
                            "-DLOCKSTEP_CUDA=ON where the CUDA toolkit is installed); or use {}",
                            asked, instead));
  const std::string reason =
      c.gpus.unavailable_reason.empty() ? "no CUDA device found" : c.gpus.unavailable_reason;
  if (c.cuda_visible_devices)
    throw Error(fmt::format("{}: no GPU visible (CUDA_VISIBLE_DEVICES={}): {}; or use {}", asked,
                            runtime::quoted_value(*c.cuda_visible_devices), reason, instead));
  throw Error(fmt::format("{}: {}; run on a machine with a GPU, or use {}", asked, reason,
                          instead));
}

// N of "cuda:N"; nullopt when the text is not of that form.
std::optional<int> gpu_index(const std::string& text) {
  if (!text.starts_with("cuda:")) return std::nullopt;
  const char* first = text.data() + 5;
  const char* last = text.data() + text.size();
  int index = -1;
  auto [end, ec] = std::from_chars(first, last, index);
  if (ec != std::errc{} || end != last || first == last || index < 0) return std::nullopt;
  return index;
}

}  // namespace

DeviceChoice choose_device(const DeviceRequest& r, const DeviceContext& c) {
  if (r.text == "cpu") return {runtime::Device::cpu(), {}};
  const std::optional<int> index = gpu_index(r.text);
  LOCKSTEP_CHECK(r.text == "auto" || r.text == "cuda" || index,
                 "{}: not a device; use auto, cpu, cuda or cuda:N", written(r.origin, r.text));
  LOCKSTEP_CHECK(c.local_world_size >= 1 && c.local_rank >= 0 && c.local_rank < c.local_world_size,
                 "choose_device: local rank {} of {}", c.local_rank, c.local_world_size);

  if (c.gpus.count == 0) {
    if (r.text == "auto") return {runtime::Device::cpu(), {}};
    throw_no_gpu(r, c);
  }
  const std::string visible =
      c.cuda_visible_devices ? fmt::format(" (CUDA_VISIBLE_DEVICES={})",
                                               runtime::quoted_value(*c.cuda_visible_devices))
                             : "";
  if (index) {
    LOCKSTEP_CHECK(*index < c.gpus.count, "{}: {} GPU{} visible{}, cuda:0 to cuda:{}",
                   written(r.origin, r.text), c.gpus.count, c.gpus.count == 1 ? " is" : "s are",
                   visible, c.gpus.count - 1);
    std::string note;
    if (c.local_world_size > 1)
      note = fmt::format("all {} ranks on this node use cuda:{} ({})", c.local_world_size, *index,
                         written(r.origin, r.text));
    return {runtime::Device::cuda(*index), note};
  }
  std::string note;
  if (c.local_world_size > c.gpus.count)
    note = fmt::format("{} ranks on this node share {} GPU{}{} round-robin: local rank r uses "
                       "cuda:(r % {})",
                       c.local_world_size, c.gpus.count, c.gpus.count == 1 ? "" : "s", visible,
                       c.gpus.count);
  return {runtime::Device::cuda(c.local_rank % c.gpus.count), note};
}

runtime::Device select_device(const SelectDeviceOptions& options) {
  const DeviceEnv env = read_device_env(options.env);
  DeviceRequest request{.text = options.request, .origin = options.origin};
  if (request.text.empty()) {
    // An empty LOCKSTEP_DEVICE counts as unset, as an empty CUDA_VISIBLE_DEVICES does not.
    if (env.device && !env.device->empty()) request = {*env.device, "LOCKSTEP_DEVICE"};
    else request.text = "auto";
  }
  const RankInfo info = read_rank_info(options.env, {.allow_missing_store = true});
  // cpu: no CUDA initialisation.
  const runtime::GpuInventory gpus =
      request.text == "cpu" ? runtime::GpuInventory{} : runtime::probe_gpus();
  const DeviceContext context{info.local_rank, info.local_world_size, gpus,
                              env.cuda_visible_devices};
  const DeviceChoice choice = choose_device(request, context);
  if (choice.device.is_cuda()) runtime::set_current_gpu(choice.device.index);
  runtime::cuda::set_process_rank(info.rank);  // for CUDA's error messages
  if (!choice.note.empty() && info.local_rank == 0)
    std::fprintf(stderr, "lockstep: %s\n", choice.note.c_str());
  std::lock_guard lock(selected_mutex);
  selected = choice.device;
  return choice.device;
}

std::optional<runtime::Device> selected_device() {
  std::lock_guard lock(selected_mutex);
  return selected;
}

}  // namespace lockstep::distributed
