// fusedopt::pt::X against torch::optim::X with the same options: 30 steps on two param groups with
// different lrs, params missing grads on some steps, an lr change half way (a scheduler), then the
// max relative difference of all params. SGD must agree bit for bit where both sides use FMA
// (ATen's add_(alpha) is an fma on AVX2); the others agree within 1e-5, as torch's CPU sqrt is not
// correctly rounded and libtorch's C++ Adam/RMSprop use mul_+add_ where the core follows
// torch 2.x's lerp_.

#include <ATen/Version.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "fusedopt/pt/optim.h"
#include "fusedopt/runtime.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

constexpr int kSteps = 30;
constexpr double kTolerance = 1e-5;

// True when the core and ATen both evaluate add_(alpha) / addcmul_ with fused multiply-adds.
bool BothUseFma() {
  const std::string ours = fusedopt::ActiveTargetName();
  const std::string aten = at::get_cpu_capability();
  const bool ours_fma = ours.rfind("AVX2", 0) == 0 || ours.rfind("AVX3", 0) == 0;
  const bool aten_fma =
      aten.find("AVX2") != std::string::npos || aten.find("AVX512") != std::string::npos;
  return ours_fma && aten_fma;
}

// Runs Fused and Reference side by side on identical models and grads; returns both models.
template <class Fused, class Reference, class Options>
std::pair<Params, Params> RunBoth(const Options& options, int steps,
                                  torch::Dtype dtype = torch::kFloat) {
  Params fused_params = MakeParams(42, dtype);
  Params ref_params = CloneParams(fused_params);
  Fused fused(MakeGroups(fused_params, options), options);
  Reference ref(MakeGroups(ref_params, options), options);
  for (int t = 0; t < steps; ++t) {
    if (t == steps / 2) {  // hyper-parameters are live: a scheduler halves group 0's lr
      for (torch::optim::Optimizer* opt : {static_cast<torch::optim::Optimizer*>(&fused),
                                           static_cast<torch::optim::Optimizer*>(&ref)}) {
        auto& group0 = opt->param_groups()[0].options();
        group0.set_lr(group0.get_lr() * 0.5);
      }
    }
    SetGrads(fused_params, t);
    SetGrads(ref_params, t);
    fused.step();
    ref.step();
  }
  return {std::move(fused_params), std::move(ref_params)};
}

template <class Fused, class Reference, class Options>
void ExpectParity(const Options& options) {
  const auto [fused, ref] = RunBoth<Fused, Reference>(options, kSteps);
  ExpectClose(fused, ref, kTolerance);
}

void ExpectSgdParity(const torch::optim::SGDOptions& options) {
  const auto [fused, ref] = RunBoth<SGD, torch::optim::SGD>(options, kSteps);
  if (BothUseFma()) {
    EXPECT_TRUE(BitwiseEqual(fused, ref)) << "max rel diff " << MaxRelDiff(fused, ref);
  } else {
    std::printf("[   info   ] SGD bitwise check skipped: core target %s, ATen capability %s\n",
                fusedopt::ActiveTargetName().c_str(), at::get_cpu_capability().c_str());
  }
  ExpectClose(fused, ref, kTolerance);
}

TEST(TorchParity, SgdPlain) { ExpectSgdParity(torch::optim::SGDOptions(0.1)); }
TEST(TorchParity, SgdMomentumWeightDecay) {
  ExpectSgdParity(torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2));
}
TEST(TorchParity, SgdNesterov) {
  ExpectSgdParity(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3));
}
TEST(TorchParity, SgdDampening) {
  ExpectSgdParity(torch::optim::SGDOptions(0.05).momentum(0.8).dampening(0.3));
}

TEST(TorchParity, AdamDefaults) {
  ExpectParity<Adam, torch::optim::Adam>(torch::optim::AdamOptions(1e-2));
}
TEST(TorchParity, AdamAmsgradWeightDecay) {
  const auto options = torch::optim::AdamOptions(1e-2).weight_decay(0.1).amsgrad(true);
  ExpectParity<Adam, torch::optim::Adam>(options);
}
TEST(TorchParity, AdamBetasEps) {
  const auto options = torch::optim::AdamOptions(3e-3).betas({0.8, 0.99}).eps(1e-6);
  ExpectParity<Adam, torch::optim::Adam>(options);
}

TEST(TorchParity, AdamWDefaults) {
  ExpectParity<AdamW, torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2));
}
TEST(TorchParity, AdamWAmsgradWeightDecay) {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true);
  ExpectParity<AdamW, torch::optim::AdamW>(options);
}

TEST(TorchParity, RmspropDefaults) {
  ExpectParity<RMSprop, torch::optim::RMSprop>(torch::optim::RMSpropOptions(1e-2));
}
TEST(TorchParity, RmspropCenteredMomentum) {
  const auto options = torch::optim::RMSpropOptions(1e-3).centered(true).momentum(0.9);
  ExpectParity<RMSprop, torch::optim::RMSprop>(options);
}
TEST(TorchParity, RmspropMomentumWeightDecay) {
  const auto options =
      torch::optim::RMSpropOptions(1e-3).momentum(0.5).weight_decay(0.1).alpha(0.9);
  ExpectParity<RMSprop, torch::optim::RMSprop>(options);
}

TEST(TorchParity, AdagradDefaults) {
  ExpectParity<Adagrad, torch::optim::Adagrad>(torch::optim::AdagradOptions(1e-2));
}
TEST(TorchParity, AdagradLrDecayInitialAccumulator) {
  const auto options = torch::optim::AdagradOptions(5e-2)
                           .lr_decay(0.01)
                           .initial_accumulator_value(0.1)
                           .weight_decay(0.05)
                           .eps(1e-8);
  ExpectParity<Adagrad, torch::optim::Adagrad>(options);
}

// Step counts are per param, as torch's state step: each param counts only the steps it had a grad.
// States are kept in the param's dtype (bf16 here), as torch keeps them.
TEST(TorchParity, StepCountsArePerParam) {
  Params params = MakeParams(7, torch::kBFloat16);
  const auto options = torch::optim::AdamOptions(1e-3);
  Adam opt(MakeGroups(params, options), options);
  for (int t = 0; t < 10; ++t) {
    SetGrads(params, t);
    opt.step();
  }
  int flat = 0;
  for (const auto& group : params) {
    for (const auto& p : group) {
      int expected = 0;
      for (int t = 0; t < 10; ++t) expected += HasGrad(t, flat) ? 1 : 0;
      const auto& state = static_cast<const torch::optim::AdamParamState&>(
          *opt.state().at(p.unsafeGetTensorImpl()));
      EXPECT_EQ(state.step(), expected) << "param " << flat;
      EXPECT_EQ(state.exp_avg().scalar_type(), torch::kBFloat16);
      EXPECT_EQ(state.exp_avg_sq().scalar_type(), torch::kBFloat16);
      ++flat;
    }
  }
}

// bf16/f16 params. torch rounds every intermediate to the 16-bit type, the core only the stored
// values, and each step rounds the params: the two agree to a few storage ulps at each tensor's
// scale (the tolerances: 4 ulps), not to f32 precision. A dtype or group mix-up in the adapter
// would be far off.
template <class Fused, class Reference, class Options>
void ExpectLowPrecisionParity(const Options& options, torch::Dtype dtype, double tolerance) {
  const auto [fused, ref] = RunBoth<Fused, Reference>(options, 10, dtype);
  for (const auto& group : fused) {
    for (const auto& p : group) EXPECT_EQ(p.scalar_type(), dtype);
  }
  ExpectCloseNormwise(fused, ref, tolerance);
}

TEST(TorchParity, AdamWBf16) {
  ExpectLowPrecisionParity<AdamW, torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2),
                                                       torch::kBFloat16, 4 * 0x1p-8);
}
TEST(TorchParity, AdamWF16) {
  ExpectLowPrecisionParity<AdamW, torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2),
                                                       torch::kHalf, 4 * 0x1p-11);
}
TEST(TorchParity, SgdMomentumBf16) {
  ExpectLowPrecisionParity<SGD, torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9),
                                                   torch::kBFloat16, 4 * 0x1p-8);
}

// step(closure) evaluates the closure with grad mode on, steps, and returns the closure's loss.
TEST(TorchParity, ClosureReturnsLoss) {
  Params fused_params = MakeParams(3);
  Params ref_params = CloneParams(fused_params);
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  SGD fused(fused_params[0], options);
  torch::optim::SGD ref(ref_params[0], options);
  auto closure_for = [](torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& ps) {
    return [&opt, &ps] {
      opt.zero_grad();
      torch::Tensor loss = torch::zeros({});
      for (const auto& p : ps) loss = loss + (p * p).sum();
      loss.backward();
      return loss;
    };
  };
  for (int t = 0; t < 3; ++t) {
    torch::NoGradGuard no_grad;  // the optimizer must turn grad mode on for the closure itself
    const torch::Tensor fused_loss = fused.step(closure_for(fused, fused_params[0]));
    const torch::Tensor ref_loss = ref.step(closure_for(ref, ref_params[0]));
    ASSERT_TRUE(fused_loss.defined());
    EXPECT_EQ(fused_loss.item<float>(), ref_loss.item<float>());
  }
  ExpectClose(fused_params, ref_params, kTolerance);
}

// torch's Adagrad fills `sum` in its constructor only; a group added later gets its state on its
// first step, from its own initial_accumulator_value (torch::optim::Adagrad would fail there).
TEST(TorchParity, AdagradGroupAddedLater) {
  Params late = MakeParams(5);
  Params early = CloneParams(late);
  const auto options = torch::optim::AdagradOptions(0.05).initial_accumulator_value(0.2);
  Adagrad fused(late[0], options);
  fused.add_param_group(torch::optim::OptimizerParamGroup(
      late[1], std::make_unique<torch::optim::AdagradOptions>(options)));
  torch::optim::Adagrad ref(MakeGroups(early, options, 1.0), options);
  for (int t = 0; t < 5; ++t) {
    SetGrads(late, t);
    SetGrads(early, t);
    fused.step();
    ref.step();
  }
  ExpectClose(late, early, kTolerance);
}

// A step writes params in place, so it bumps their version counters as torch::optim::Adam's
// in-place ops do: autograd then reports a graph that saved a param before the step.
TEST(TorchParity, StepBumpsParamVersions) {
  torch::Tensor fused_w = torch::randn({6}).requires_grad_(true);
  torch::Tensor ref_w = fused_w.detach().clone().requires_grad_(true);
  Adam fused({fused_w}, torch::optim::AdamOptions(1e-2));
  torch::optim::Adam ref({ref_w}, torch::optim::AdamOptions(1e-2));
  const torch::Tensor fused_loss = (fused_w * fused_w).sum();  // saves fused_w for backward
  fused_w.mutable_grad() = torch::randn({6});
  ref_w.mutable_grad() = fused_w.grad().clone();
  const auto fused_version = fused_w._version();
  const auto ref_version = ref_w._version();
  fused.step();
  ref.step();
  EXPECT_GT(fused_w._version(), fused_version);
  EXPECT_GT(ref_w._version(), ref_version);
  EXPECT_THROW(fused_loss.backward(), c10::Error);
}

}  // namespace
}  // namespace fusedopt::pt::test
