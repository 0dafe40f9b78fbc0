// gpt_train's command-line options.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "corpus.h"

namespace gpt_example {

struct Options {
  // The model (byte-level: 256 tokens; the context is --seq-len).
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t seq_len = 128;
  double dropout = 0.0;
  bool bias = true;  // biases in the Linear and LayerNorm layers (nanoGPT's bias)
  bool checkpoint_blocks = false;  // recompute each block's activations in backward
  std::string amp = "none";        // none, bf16, f16: autocast's dtype (f16 with loss scaling)
  // Training: AdamW with decay on the matrices only, warmup then cosine.
  int64_t steps = 600;
  int64_t batch_size = 16;  // sequences per step on each rank
  double lr = 2e-3;
  double min_lr = 1e-4;
  double weight_decay = 0.1;
  int64_t warmup_steps = 50;
  double clip_grad_norm = 1.0;  // 0: no clipping
  bool zero = false;
  // Checkpoints, as fashion_mnist's.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int keep_last = 2;
  bool resume = false;
  bool restart = false;
  // Evaluation and output.
  int64_t eval_every = 200;  // steps; also at the end
  int64_t eval_windows = 128;
  int64_t log_every = 50;
  std::string prompt = "The meaning of life is";
  int64_t sample_bytes = 300;
  double temperature = 0.8;
  uint64_t seed = 0;
  std::string data = kFortunesDir;
  int threads = 1;
  std::string device;
  std::string backend;
  // The options that shape the run given on the command line (a resume
  // takes the saved values of the others).
  std::set<std::string> given;
};

}  // namespace gpt_example
