// Uses the installed libtorch adapter: fusedopt::pt::SGD takes the step torch::optim::SGD takes.
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cstdio>

#include "fusedopt/pt/optim.h"

int main() {
  torch::manual_seed(0);
  const torch::Tensor init = torch::randn({1000});
  const torch::Tensor grad = torch::randn({1000});
  torch::Tensor a = init.clone().requires_grad_(true), b = init.clone().requires_grad_(true);
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4);
  fusedopt::pt::SGD fused({a}, options);
  torch::optim::SGD reference({b}, options);
  for (int step = 0; step < 3; ++step) {
    a.mutable_grad() = grad.clone();
    b.mutable_grad() = grad.clone();
    fused.step();
    reference.step();
  }
  if (!torch::equal(a, b)) {
    std::printf("fusedopt::pt::SGD differs from torch::optim::SGD\n");
    return 1;
  }
  std::printf("consumer_torch: fusedopt::pt::SGD matches torch::optim::SGD\n");
  return 0;
}
