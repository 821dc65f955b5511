// The Trainer takes what a libtorch user naturally passes (issue: the documented examples did not
// compile): a module holder such as torch::nn::Sequential without .ptr(), and a
// torch::nn::functional loss (cross_entropy takes a defaulted third options argument) or a loss
// module. Each trained step must equal the hand-written libtorch loop on a copy of the model.

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/loss.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/timeline.h"
#include "fusedopt/pt/trainer.h"

namespace fusedopt::pt {
namespace {

torch::nn::Sequential MakeModel() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::ReLU(), torch::nn::Linear(5, 3));
}

// The same weights in a model of its own.
torch::nn::Sequential CopyOf(const torch::nn::Sequential& model) {
  torch::nn::Sequential copy = MakeModel();
  torch::NoGradGuard no_grad;
  const auto from = model->parameters();
  auto to = copy->parameters();
  for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

std::vector<Batch> Batches() {
  torch::manual_seed(11);
  std::vector<Batch> batches;
  batches.reserve(3);
  for (int i = 0; i < 3; ++i) batches.push_back({torch::randn({4, 6}), torch::randint(0, 3, {4})});
  return batches;
}

// The plain libtorch loop the Trainer stands for: forward, loss, backward, step, zero_grad.
template <class LossFn>
std::vector<double> TrainByHand(torch::nn::Sequential model, LossFn loss_fn) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> losses;
  for (const Batch& b : Batches()) {
    torch::Tensor loss = loss_fn(model->forward(b.input), b.target);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

template <class LossArg>
void ExpectTrainerMatchesHandLoop(LossArg loss_arg) {
  torch::nn::Sequential model = MakeModel();
  torch::nn::Sequential reference = CopyOf(model);
  const std::vector<double> expected =
      TrainByHand(reference, [](const torch::Tensor& o, const torch::Tensor& t) {
        return torch::nn::functional::cross_entropy(o, t);
      });

  fusedopt::pt::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  // As docs/train.md writes it: the holder itself, and the loss as it is.
  fusedopt::pt::Trainer trainer(
      model, [&](const torch::Tensor& x) { return model->forward(x); }, loss_arg, optimizer);
  const std::vector<Batch> batches = Batches();
  std::size_t next = 0;
  const auto stats = trainer.Train([&] { return batches[next++]; }, 3);
  ASSERT_EQ(stats.size(), expected.size());
  for (std::size_t i = 0; i < stats.size(); ++i) EXPECT_DOUBLE_EQ(stats[i].loss, expected[i]) << i;
  const auto got = model->parameters();
  const auto want = reference->parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-6, 1e-7)) << "param " << i;
  }
}

TEST(TorchTrainerApi, SequentialWithFunctionalCrossEntropy) {
  ExpectTrainerMatchesHandLoop(torch::nn::functional::cross_entropy);
}

TEST(TorchTrainerApi, SequentialWithLossModule) {
  ExpectTrainerMatchesHandLoop(torch::nn::CrossEntropyLoss());
}

TEST(TorchTrainerApi, SharedPtrModelAndLambdaLoss) {
  torch::nn::Sequential model = MakeModel();
  std::shared_ptr<torch::nn::SequentialImpl> ptr = model.ptr();
  fusedopt::pt::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  fusedopt::pt::Trainer trainer(
      ptr, [&](const torch::Tensor& x) { return ptr->forward(x); },
      [](const torch::Tensor& o, const torch::Tensor& t) {
        return torch::nn::functional::cross_entropy(o, t);
      },
      optimizer);
  const std::vector<Batch> batches = Batches();
  const Batch& b = batches[0];
  const double expected =
      torch::nn::functional::cross_entropy(model->forward(b.input), b.target).item<double>();
  EXPECT_DOUBLE_EQ(trainer.Step([&] { return b; }).loss, expected);
}

TEST(TorchTrainerApi, NullLossIsRejected) {
  torch::nn::Sequential model = MakeModel();
  fusedopt::pt::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::Tensor (*no_loss)(const torch::Tensor&, const torch::Tensor&,
                           const torch::nn::functional::CrossEntropyFuncOptions&) = nullptr;
  EXPECT_THROW(
      fusedopt::pt::Trainer(
          model, [&](const torch::Tensor& x) { return model->forward(x); }, no_loss, optimizer),
      std::invalid_argument);
}

// The trainer accumulates in the gradients; an optimizer that accumulates too would step only every
// k-th update.
TEST(TorchTrainerApi, OptimizerAccumulationIsRejected) {
  torch::nn::Sequential model = MakeModel();
  fusedopt::pt::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.1));
  optimizer.training().accumulation_steps = 2;
  try {
    const fusedopt::pt::Trainer trainer(
        model, [&](const torch::Tensor& x) { return model->forward(x); },
        torch::nn::functional::cross_entropy, optimizer);
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("training().accumulation_steps 2"), std::string::npos)
        << e.what();
  }
}

// A trace that cannot be written (here: a full disk, which only shows when the buffer is flushed)
// is an error naming the path, not a silently truncated file.
TEST(TorchTrainerApi, TimelineWriteReportsAFullDisk) {
  Timeline timeline;
  timeline.Record(
      {.pid = 1, .name = "step", .step = 0, .ts_us = 0.0, .dur_us = 1.0, .warmup = false});
  try {
    timeline.Write("/dev/full", "{}");
    ADD_FAILURE() << "writing to /dev/full did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusedopt::pt
