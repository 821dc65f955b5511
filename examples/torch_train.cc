// Trains a small MLP on synthetic regression data with fusedopt::pt::AdamW: libtorch builds the
// model and computes the gradients, fusedopt updates all parameters in one fused pass per step.
// The step also clips the global gradient norm (training().max_grad_norm, folded into the update),
// and the lr follows a warmup-cosine fusedopt::Schedule set on the param groups by ApplySchedule.
// Prints the loss as it goes down; exits non-zero if it did not fall at least tenfold.

#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>

#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/training.h"
#include "fusedopt/runtime.h"
#include "fusedopt/schedule.h"

namespace {

// 16 inputs -> 64 hidden (tanh) -> 64 hidden (tanh) -> 1 output.
struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 64))),
        out(register_module("out", torch::nn::Linear(64, 1))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::tanh(fc2(torch::tanh(fc1(x)))));
  }

  torch::nn::Linear fc1, fc2, out;
};

}  // namespace

int main() {
  torch::manual_seed(0);
  // The target is a fixed random two-layer function of the inputs, plus a little noise.
  const torch::Tensor x = torch::randn({1024, 16});
  const torch::Tensor teacher = torch::randn({16, 8});
  const torch::Tensor readout = torch::randn({8, 1});
  const torch::Tensor y =
      torch::sin(x.matmul(teacher) * 0.5).matmul(readout) + 0.01 * torch::randn({1024, 1});

  Mlp model;
  // Weight matrices decay, biases do not: two param groups with their own AdamW options.
  std::vector<torch::Tensor> weights, biases;
  for (const auto& item : model.named_parameters()) {
    (item.key().ends_with("bias") ? biases : weights).push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(weights, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(3e-3).weight_decay(1e-2)));
  groups.emplace_back(biases, std::make_unique<torch::optim::AdamWOptions>(
                                  torch::optim::AdamWOptions(3e-3).weight_decay(0.0)));
  fusedopt::pt::AdamW optimizer(groups, torch::optim::AdamWOptions(3e-3));
  optimizer.training().max_grad_norm = 1.0;  // torch::nn::utils::clip_grad_norm_(params, 1.0)

  std::printf("fusedopt::pt::AdamW on %s, %zu param tensors in 2 groups\n",
              fusedopt::ActiveTargetName().c_str(), weights.size() + biases.size());
  double first = 0.0;
  double last = 0.0;
  constexpr int kSteps = 400;
  // 20 warmup steps from 1e-3 to 3e-3, then cosine annealing to 1e-4 at step kSteps.
  const fusedopt::Schedule schedule = fusedopt::WarmupCosine(3e-3, 20, kSteps, 1e-4);
  for (int step = 0; step <= kSteps; ++step) {
    optimizer.zero_grad();
    const torch::Tensor loss = (model.forward(x) - y).pow(2).mean();
    loss.backward();
    fusedopt::pt::ApplySchedule(optimizer, schedule, step);  // every group's lr for this step
    optimizer.step();
    last = loss.item<double>();
    if (step == 0) first = last;
    if (step % 50 == 0) {
      std::printf("step %4d  loss %.6f  lr %.2e  grad norm %.4f\n", step, last, schedule.Lr(step),
                  optimizer.last_step().grad_norm.value_or(0.0));
    }
  }
  const bool ok = last < first / 10.0;
  std::printf("loss %.6f -> %.6f (%s)\n", first, last, ok ? "down >10x" : "NOT down 10x");
  return ok ? 0 : 1;
}
