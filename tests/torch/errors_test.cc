// Arguments a fused step cannot take raise c10::Error (TORCH_CHECK) naming the optimizer and the
// param, and a rejected step changes nothing: no param, state or step count.

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>

#include "fusedopt/pt/optim.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

torch::Tensor Param(const torch::Tensor& values) { return values.requires_grad_(true); }

TEST(TorchErrors, SparseGradient) {
  torch::Tensor a = Param(torch::randn({4}));
  torch::Tensor b = Param(torch::randn({5}));
  Adam opt({a, b}, torch::optim::AdamOptions(1e-3));
  a.mutable_grad() = torch::randn({4});
  b.mutable_grad() = torch::randn({5}).to_sparse();
  ExpectTorchError([&] { opt.step(); },
                   {"fusedopt::pt::Adam", "param_groups[0].params[1]", "sparse gradient"});
}

TEST(TorchErrors, NonContiguousParam) {
  torch::Tensor w = Param(torch::randn({4, 6}).t());
  SGD opt({w}, torch::optim::SGDOptions(0.1));
  opt.training().strict = true;  // (otherwise torch's own step takes it: fallback_test.cc)
  w.mutable_grad() = torch::randn({6, 4});
  ExpectTorchError([&] { opt.step(); },
                   {"fusedopt::pt::SGD", "param_groups[0].params[0]", "not contiguous"});
}

TEST(TorchErrors, UnsupportedDtype) {
  torch::Tensor w = Param(torch::randn({3}, torch::kDouble));
  RMSprop opt({w}, torch::optim::RMSpropOptions(1e-2));
  opt.training().strict = true;
  w.mutable_grad() = torch::randn({3}, torch::kDouble);
  ExpectTorchError([&] { opt.step(); }, {"param_groups[0].params[0]", "dtype", "Double"});
}

TEST(TorchErrors, GradShapeMismatch) {
  torch::Tensor w = Param(torch::randn({3, 2}));
  AdamW opt({w}, torch::optim::AdamWOptions(1e-3));
  w.mutable_grad() = torch::randn({2, 3});
  ExpectTorchError([&] { opt.step(); }, {"gradient of param_groups[0].params[0]", "shape"});
}

TEST(TorchErrors, ParamInTwoGroups) {
  torch::Tensor w = Param(torch::randn({8}));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w});
  groups.emplace_back(std::vector<torch::Tensor>{w});
  Adagrad opt(groups, torch::optim::AdagradOptions(1e-2));
  w.mutable_grad() = torch::randn({8});
  ExpectTorchError([&] { opt.step(); },
                   {"param_groups[0].params[0]", "param_groups[1].params[0]", "share memory"});
}

// Group 0 is fine, group 1 holds a bad param: the step must not touch group 0 either, create no
// state and count no step; after the fix the first step is step 1.
TEST(TorchErrors, RejectedStepChangesNothing) {
  Params params = MakeParams(9);
  const auto options = torch::optim::AdamOptions(1e-2);
  Adam opt(MakeGroups(params, options), options);
  const Params before = CloneParams(params);
  SetGrads(params, 0);
  params[1][0].mutable_grad() = torch::randn({64, 3}).to_sparse();
  ExpectTorchError([&] { opt.step(); }, {"param_groups[1].params[0]"});
  EXPECT_TRUE(BitwiseEqual(params, before));
  EXPECT_TRUE(opt.state().empty());

  params[1][0].mutable_grad() = torch::randn({64, 3});
  opt.step();
  const auto& state = static_cast<const torch::optim::AdamParamState&>(
      *opt.state().at(params[0][0].unsafeGetTensorImpl()));
  EXPECT_EQ(state.step(), 1);
}

// An invalid hyper-parameter set after construction (a live option) is caught by the core's
// validation, before any buffer is written, and reported as a c10::Error.
TEST(TorchErrors, InvalidLiveOption) {
  torch::Tensor w = Param(torch::randn({5}));
  SGD opt({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  const torch::Tensor before = w.detach().clone();
  static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options()).momentum(-1.0);
  w.mutable_grad() = torch::randn({5});
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::SGD", "momentum", "-1"});
  EXPECT_TRUE(torch::equal(w.detach(), before));
  EXPECT_TRUE(opt.state().empty());
}

// State loaded from a model of another shape (torch::load matches params by order only) is
// rejected on the next step.
TEST(TorchErrors, StateOfAnotherShape) {
  torch::Tensor small = Param(torch::randn({4}));
  Adam saved({small}, torch::optim::AdamOptions(1e-3));
  small.mutable_grad() = torch::randn({4});
  saved.step();
  std::stringstream buffer;
  torch::save(saved, buffer);

  torch::Tensor large = Param(torch::randn({5}));
  Adam loaded({large}, torch::optim::AdamOptions(1e-3));
  torch::load(loaded, buffer);
  large.mutable_grad() = torch::randn({5});
  ExpectTorchError([&] { loaded.step(); },
                   {"state 'exp_avg' of param_groups[0].params[0]", "4 elements", "has 5"});
}

// Construction checks are torch's own (the classes derive from torch::optim's).
TEST(TorchErrors, ConstructorChecksAreTorchs) {
  torch::Tensor w = Param(torch::randn({5}));
  ExpectTorchError(
      [&] {
        Adam({w}, torch::optim::AdamOptions(1e-3).betas({1.5, 0.9}));
      },
      {"Invalid beta parameter at index 0"});
  ExpectTorchError([&] { SGD({w}, torch::optim::SGDOptions(0.1).nesterov(true)); },
                   {"Nesterov momentum requires a momentum and zero dampening"});
}

}  // namespace
}  // namespace fusedopt::pt::test
