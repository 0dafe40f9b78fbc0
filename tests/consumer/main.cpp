// Uses an installed lockstep through its umbrella header: one process (rank 0
// of 1, as without a launcher) trains a linear model with DDP and SGD for a
// few steps. Prints the numel of a 2x3 tensor of ones and exits 0 iff that is
// 6 and the loss went down.
#include <iostream>
#include <memory>

#include "lockstep/collectives/backends.h"
#include "lockstep/lockstep.h"

int main() {
  namespace rt = lockstep::runtime;
  const auto t = rt::Tensor::ones({2, 3});
  std::cout << "lockstep " << LOCKSTEP_VERSION_STRING << ": numel " << t.numel()
            << ", backends:";
  for (const auto& name : lockstep::collectives::built_in_backends()) std::cout << ' ' << name;
  std::cout << '\n';

  auto group = lockstep::collectives::init_process_group();
  rt::Generator g(0);
  auto model = std::make_shared<lockstep::nn::Linear>(3, 1, true, g);
  auto ddp = std::make_shared<lockstep::nn::DistributedDataParallel>(model, group);
  lockstep::optim::SGD opt(model->parameters(), {.lr = 0.1});
  const rt::Tensor x = rt::randn({16, 3}, rt::DType::f32, g);
  const rt::Tensor y = rt::sum(x, {1}, /*keepdim=*/true);
  double first = 0;
  double last = 0;
  for (int step = 0; step < 20; ++step) {
    rt::Tensor loss = rt::mse_loss((*ddp)(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item();
    if (step == 0) first = last;
  }
  std::cout << "loss " << first << " -> " << last << '\n';
  return t.numel() == 6 && last < first ? 0 : 1;
}
