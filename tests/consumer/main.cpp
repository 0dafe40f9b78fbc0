// Uses an installed lockstep: prints the numel of a 2x3 tensor of ones and
// exits 0 iff it is 6.
#include <iostream>

#include "lockstep/collectives/backends.h"
#include "lockstep/config.h"
#include "lockstep/runtime/tensor.h"

int main() {
  const auto t = lockstep::runtime::Tensor::ones({2, 3});
  std::cout << "lockstep " << LOCKSTEP_VERSION_STRING << ": numel " << t.numel()
            << ", backends:";
  for (const auto& name : lockstep::collectives::built_in_backends()) std::cout << ' ' << name;
  std::cout << '\n';
  return t.numel() == 6 ? 0 : 1;
}
