// What the libtorch examples of README.md and docs/*.md may use without declaring it
// (docs/testing.md): a small classifier, its forward, an optimizer, a schedule, a data source, a
// progress callback and a loss. The generated tests/docs blocks include this first.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <cstdio>

#include "fusedopt/pt/checkpoint.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/trainer.h"
#include "fusedopt/pt/training.h"
#include "tests/docs/prelude_core.h"

inline torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                   torch::nn::Linear(16, 4));
inline fusedopt::pt::Trainer::Forward forward = [](const torch::Tensor& x) {
  return model->forward(x);
};
inline fusedopt::pt::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
inline fusedopt::Schedule schedule = fusedopt::WarmupCosine(1e-3, 100, 10'000, 1e-5);
// A fixed pool of batches: 4 samples of 8 features, 4 classes.
inline fusedopt::pt::Batch next_batch() {
  static std::int64_t i = 0;
  torch::manual_seed(i++ % 16);
  return {torch::randn({4, 8}), torch::randint(0, 4, {4})};
}
inline void print_progress(const fusedopt::pt::UpdateStats& u) {
  if ((u.update + 1) % 2500 == 0)
    std::printf("  update %lld loss %.4f\n", static_cast<long long>(u.update + 1), u.loss);
}
// A loss of the model on one batch, computed anew before each block (an earlier block's training
// changes the params its graph saved).
inline torch::Tensor loss;
inline const bool loss_before_each = [] {
  doc_prelude::before_each = [] {
    const fusedopt::pt::Batch b = next_batch();
    loss = torch::nn::functional::cross_entropy(model->forward(b.input), b.target);
  };
  return true;
}();
