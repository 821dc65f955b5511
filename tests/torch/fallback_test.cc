// What torch::optim takes, fusedopt::pt takes: params the engine cannot update (float64,
// non-contiguous, sparse grads for SGD and Adagrad) go through the torch::optim twin's own step
// within the same step(), so they come out bit for bit as torch's, while the others stay fused;
// training().strict = true makes each of them an error again (errors_test.cc).

#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>

#include "fusedopt/pt/optim.h"
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

// Clipping and loss scaling span all params; with routed ones they are an error that changes
// nothing.
TEST(TorchFallback, ClippingWithRoutedParamsIsAnError) {
  Params params = MixedModel();
  const auto options = torch::optim::AdamOptions(1e-2);
  Adam opt(MakeGroups(params, options), options);
  opt.training().max_grad_norm = 1.0;
  SetGrads(params, 0);
  const Params before = CloneParams(params);
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::Adam", "max_grad_norm", "param_groups[1]"});
  EXPECT_TRUE(BitwiseEqual(params, before));
  EXPECT_TRUE(opt.state().empty());
}

}  // namespace
}  // namespace fusedopt::pt::test
