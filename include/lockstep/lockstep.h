// lockstep in one include: the public API of lockstep::lockstep.
//
//   #include "lockstep/lockstep.h"
//   auto group = lockstep::collectives::init_process_group();
//   auto ddp = std::make_shared<lockstep::nn::DistributedDataParallel>(model, group);
//
// What it leaves out: the backends' own headers (collectives/shm, gloo, mpi,
// nccl; runtime/cuda), which need their toolkits' headers and which a program
// reaches through ProcessGroup and Tensor anyway; the example models
// (lockstep/models/, target lockstep::models); and detail/ folders, which are
// not installed.
#pragma once

#include "lockstep/config.h"

// Tensors, ops, autograd, random numbers, mixed precision.
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/backward_callbacks.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "lockstep/runtime/threads.h"

// Data and checkpoint files.
#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "lockstep/runtime/checkpoint/safetensors.h"
#include "lockstep/runtime/data/dataset.h"
#include "lockstep/runtime/data/distributed_sampler.h"
#include "lockstep/runtime/data/idx.h"
#include "lockstep/runtime/data/loader.h"
#include "lockstep/runtime/data/sampler.h"

// This process in its job: the launcher's variables, its device, the store.
#include "lockstep/distributed/device_select.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/store/tcp_store.h"

// Process groups.
#include "lockstep/collectives/init.h"
#include "lockstep/collectives/new_group.h"
#include "lockstep/collectives/process_group.h"
#include "lockstep/collectives/rank_text.h"
#include "lockstep/collectives/spawn.h"

// Modules, DDP, SyncBatchNorm, DataParallel, Join.
#include "lockstep/nn/nn.h"

// Optimizers, schedules, clipping, loss scaling, ZeRO.
#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"

// Training checkpoints and the runs they belong to.
#include "lockstep/train/run_settings.h"
#include "lockstep/train/training_checkpoint.h"
#include "lockstep/train/training_run.h"
