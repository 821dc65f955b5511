// What torch::optim takes, fusedopt::pt takes: params the engine cannot update (float64,
// non-contiguous, sparse grads for SGD and Adagrad) go through the torch::optim twin's own step
// within the same step(), so they come out bit for bit as torch's, while the others stay fused;
// training().strict = true makes each of them an error again (errors_test.cc).

#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>
#include <torch/types.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "fusedopt/pt/optim.h"
#include "fusedopt/scaler.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

// Group 0 of f32 params (fused; the transposed one is not contiguous and is routed), group 1 of
// f64 params (routed).
Params MixedModel() {
  Params f32 = MakeParams(42);
  Params f64 = MakeParams(43, torch::kDouble);
  f32[0][1] = torch::randn({5, 33}).t().detach().requires_grad_(true);
  return {f32[0], f64[1]};
}

template <class Fused, class Reference, class Options>
void ExpectRoutedParity(const Options& options) {
  Params fused_params = MixedModel();
  Params ref_params = CloneParams(fused_params);
  fused_params[0][1] = fused_params[0][1].detach().t().contiguous().t().requires_grad_(true);
  ref_params[0][1] = ref_params[0][1].detach().t().contiguous().t().requires_grad_(true);
  Fused fused(MakeGroups(fused_params, options), options);
  Reference ref(MakeGroups(ref_params, options), options);
  for (int t = 0; t < 12; ++t) {
    SetGrads(fused_params, t);
    SetGrads(ref_params, t);
    fused.step();
    ref.step();
  }
  EXPECT_TRUE(BitwiseEqual({fused_params[1]}, {ref_params[1]}))
      << "f64 max rel diff " << MaxRelDiff({fused_params[1]}, {ref_params[1]});
  EXPECT_TRUE(fused_params[0][1].equal(ref_params[0][1])) << "the non-contiguous param";
  ExpectClose({fused_params[0]}, {ref_params[0]}, 1e-5);
  EXPECT_EQ(fused.state().size(), ref.state().size());
}

TEST(TorchFallback, Sgd) {
  ExpectRoutedParity<SGD, torch::optim::SGD>(
      torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2));
}
TEST(TorchFallback, Adam) {
  ExpectRoutedParity<Adam, torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true));
}
TEST(TorchFallback, AdamW) {
  ExpectRoutedParity<AdamW, torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2));
}
TEST(TorchFallback, Rmsprop) {
  ExpectRoutedParity<RMSprop, torch::optim::RMSprop>(
      torch::optim::RMSpropOptions(1e-2).momentum(0.5).centered(true));
}
TEST(TorchFallback, Adagrad) {
  ExpectRoutedParity<Adagrad, torch::optim::Adagrad>(torch::optim::AdagradOptions(5e-2));
}

// An embedding's sparse grad goes to torch's SGD (which takes it); the dense param stays fused.
TEST(TorchFallback, SparseGradSgd) {
  const auto options = torch::optim::SGDOptions(0.1);
  torch::manual_seed(5);
  const torch::Tensor emb = torch::randn({10, 4});
  const torch::Tensor dense = torch::randn({50});
  std::pair<torch::Tensor, torch::Tensor> ours{emb.clone().requires_grad_(true),
                                               dense.clone().requires_grad_(true)};
  std::pair<torch::Tensor, torch::Tensor> theirs{emb.clone().requires_grad_(true),
                                                 dense.clone().requires_grad_(true)};
  SGD fused({ours.first, ours.second}, options);
  torch::optim::SGD ref({theirs.first, theirs.second}, options);
  for (int t = 0; t < 4; ++t) {
    const torch::Tensor rows = torch::tensor({{t % 10, (3 * t + 1) % 10}}, torch::kLong);
    const torch::Tensor sparse =
        torch::sparse_coo_tensor(rows, torch::full({2, 4}, 0.5 + t), {10, 4});
    const torch::Tensor g = torch::randn({50});
    ours.first.mutable_grad() = sparse;
    theirs.first.mutable_grad() = sparse;
    ours.second.mutable_grad() = g;
    theirs.second.mutable_grad() = g.clone();
    fused.step();
    ref.step();
  }
  EXPECT_TRUE(ours.first.equal(theirs.first));
  EXPECT_TRUE(ours.second.allclose(theirs.second, 1e-6, 1e-7));
}

// The scaler's unscale and skip and max_grad_norm's global norm span both paths: the same as
// unscaling, torch::nn::utils::clip_grad_norm_ over all params and torch::optim's step (to
// rounding: the fused step folds the clip factor into its gradient scale).
TEST(TorchFallback, ScalerAndClippingSpanBothPaths) {
  Params ours = MixedModel();
  Params theirs = CloneParams(ours);
  const auto options = torch::optim::AdamOptions(1e-2);
  Adam fused(MakeGroups(ours, options), options);
  torch::optim::Adam ref(MakeGroups(theirs, options), options);
  LossScaler scaler = LossScaler::Static(1024.0f);
  fused.training().scaler = &scaler;
  fused.training().max_grad_norm = 1.0;
  for (int t = 0; t < 6; ++t) {
    SetGrads(theirs, t);
    SetGrads(ours, t);
    for (std::size_t g = 0; g < ours.size(); ++g) {
      for (std::size_t i = 0; i < ours[g].size(); ++i) {
        if (!ours[g][i].grad().defined()) continue;
        ours[g][i].mutable_grad() = ours[g][i].grad() * 1024.0;
        if (t == 3 && g == 1) ours[g][i].mutable_grad()[0] = INFINITY;  // a routed grad overflows
      }
    }
    const Params before = CloneParams(ours);
    fused.step();
    if (t == 3) {  // the whole step is skipped, on both paths
      EXPECT_FALSE(fused.last_step().stepped);
      EXPECT_TRUE(fused.last_step().found_inf);
      EXPECT_TRUE(BitwiseEqual(ours, before));
      continue;
    }
    std::vector<torch::Tensor> all;
    for (const auto& group : theirs) all.insert(all.end(), group.begin(), group.end());
    const double norm = torch::nn::utils::clip_grad_norm_(all, 1.0);
    ref.step();
    ASSERT_TRUE(fused.last_step().grad_norm.has_value());
    EXPECT_NEAR(*fused.last_step().grad_norm, norm, 1e-6 * norm);
  }
  ExpectClose(ours, theirs, 1e-5);
}

}  // namespace
}  // namespace fusedopt::pt::test
