// The models the step and DDP benchmarks time, by the name given on their
// command line, with the shape of their synthetic batches. The PyTorch peers
// (step_bench_torch.py, ddp_bench_torch.py) build the same models.
//
//   mlp       Fashion-MNIST MLP, input [N, 1, 28, 28]   (launch-bound on a GPU)
//   cnn       Fashion-MNIST CNN, input [N, 1, 28, 28]   (launch-bound on a GPU)
//   resnet18  ResNet-18 for CIFAR, input [N, 3, 32, 32] (compute-bound)
//
// and, for the step benchmark only, a GPT (models/gpt.h), whose input is token
// ids [N, T] rather than images, so it is not among model_names():
//
//   gpt       CPU: vocab 256 (bytes), block 128, 4 layers, 4 heads, n_embd 128
//             CUDA: GPT-2 124M (GptConfig::gpt2(): block 1024, 12 layers)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/models/gpt.h"
#include "lockstep/nn/module.h"

namespace lockstep::bench {

// {"mlp", "cnn", "resnet18"}, for CLI11's IsMember.
const std::vector<std::string>& model_names();

// A fresh model, its weights drawn from `gen`.
std::shared_ptr<nn::Module> make_model(const std::string& name, runtime::Generator& gen);

// [batch, C, H, W] of the model's input.
runtime::Shape input_shape(const std::string& name, int64_t batch);

// The batch a benchmark uses when none is given: 64 for mlp and cnn, 256 for
// resnet18 (the batch of the GPU goals: small models launch-bound, ResNet
// compute-bound), 8 sequences for gpt.
int64_t default_batch(const std::string& name);

// The GPT a benchmark times on `device`: on the CPU a small byte-level model
// that steps in tens of milliseconds at one thread (842,496 parameters), on a
// GPU GPT-2 124M. Its block_size is the default sequence length.
models::GptConfig gpt_config(const runtime::Device& device);

}  // namespace lockstep::bench
