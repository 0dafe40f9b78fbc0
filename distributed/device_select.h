// Which device a rank computes on: its own GPU where there are GPUs, the CPU
// where there are none. Programs call select_device() once, before any
// tensor, CUDA stream or process group exists.
//
// Requests (a program's --device, else LOCKSTEP_DEVICE, else auto):
//   auto     cuda:(local rank % visible GPUs) when lockstep is built with CUDA
//            and a GPU is visible; the CPU otherwise. More ranks on a node
//            than GPUs: ranks share them round-robin, and a note says so.
//   cpu      the CPU.
//   cuda     as auto, but an error where no GPU can be used, saying why.
//   cuda:N   visible GPU N (CUDA numbers the GPUs CUDA_VISIBLE_DEVICES shows).
#pragma once

#include <optional>
#include <string>

#include "lockstep/runtime/cuda_available.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/distributed/launch_env.h"

namespace lockstep::distributed {

struct DeviceRequest {
  std::string text = "auto";     // auto, cpu, cuda or cuda:N
  std::string origin = "device";  // who asked, for errors: "--device", "LOCKSTEP_DEVICE"
};

struct DeviceChoice {
  runtime::Device device;
  std::string note;  // one line for the user where ranks share GPUs; else empty
};

// Where this rank stands, and what the machine shows it.
struct DeviceContext {
  int local_rank = 0;
  int local_world_size = 1;
  runtime::GpuInventory gpus;
  std::optional<std::string> cuda_visible_devices;  // as set; nullopt when unset
};

// The decision alone: no CUDA call, so tests drive it with any context.
// Throws lockstep::Error for a request that cannot be met, naming the request
// and what is missing (no CUDA in this build, no GPU visible and why, an
// index past the visible GPUs).
DeviceChoice choose_device(const DeviceRequest& request, const DeviceContext& context);

struct SelectDeviceOptions {
  // Empty: LOCKSTEP_DEVICE where set, else auto.
  std::string request;
  // How the program's users give the request, for errors ("--device").
  std::string origin = "--device";
  EnvLookup env = process_env();
};

// Reads the local rank and size (launch_env.h), LOCKSTEP_DEVICE and
// CUDA_VISIBLE_DEVICES, probes the GPUs, chooses, makes a chosen GPU the
// calling thread's current device (NCCL communicators, streams and the
// allocator follow it), and writes the note, if any, to stderr from local
// rank 0. Returns the device.
runtime::Device select_device(const SelectDeviceOptions& options = {});

// What select_device() last returned in this process; nullopt before it runs.
// init_process_group() chooses its default backend by it.
std::optional<runtime::Device> selected_device();

}  // namespace lockstep::distributed
