// fashion_mnist's command-line options, shared by its files.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "lockstep/models/fashion_mnist.h"

namespace fashion_mnist {

struct Options {
  std::string model = "mlp";
  int epochs = 1;
  int64_t batch_size = 64;
  int64_t train_samples = 0;  // 0: the whole training set
  int64_t test_samples = 0;   // 0: the whole test set
  std::string optimizer = "sgd";
  double lr = 0;  // 0: the optimizer's usual rate (SGD 0.05, Adam/AdamW 1e-3)
  double momentum = 0.9;
  std::optional<double> weight_decay;  // unset: 0, or AdamW's own default 1e-2
  std::string lr_schedule = "none";
  int64_t warmup_steps = 100;
  double clip_grad_norm = 0;  // 0: no clipping
  bool zero = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0: at the end of each epoch
  int keep_last = 2;
  bool resume = false;
  bool restart = false;  // move the checkpoints in --checkpoint-dir aside, start a new run
  uint64_t seed = 0;
  std::string data = lockstep::models::kFashionMnistDir;
  int log_every = 100;
  std::string log_json;  // empty: no JSON log (training_log.h)
  int threads = 1;
  bool sync_bn = false;
  std::string device;   // empty: LOCKSTEP_DEVICE, else auto
  std::string backend;
  // The options that shape the run set on the command line ("lr",
  // "batch_size", ...; resume_settings.h): a resume takes the others from
  // the checkpoint.
  std::set<std::string> given;
};

}  // namespace fashion_mnist
