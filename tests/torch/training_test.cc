// Training-loop features of the adapter: fusedopt::pt::ClipGradNorm / ClipGradValue against
// torch::nn::utils' clip_grad_norm_ / clip_grad_value_, the optimizers' training() options
// (max_grad_norm folded into the step, a LossScaler skipping overflowed steps bit-identically), and
// ApplySchedule against Schedule::Lr; stochastic rounding's noise changing every step (SGD and
// Lion, which torch counts no steps for, too).

#include "fusedopt/pt/training.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fusedopt/checkpoint_file.h"
#include "fusedopt/pt/checkpoint.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/scaler.h"
#include "fusedopt/schedule.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

std::vector<torch::Tensor> Flat(const Params& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& group : params) flat.insert(flat.end(), group.begin(), group.end());
  return flat;
}

// The grads of a model as a Params (an empty tensor where a grad is undefined), for Compare.
Params Grads(const Params& params) {
  Params grads;
  for (const auto& group : params) {
    grads.emplace_back();
    for (const auto& p : group) {
      grads.back().push_back(p.grad().defined() ? p.grad().detach().clone() : torch::empty({0}));
    }
  }
  return grads;
}

// The same grads (deep copies, optionally converted to `dtype`) on a second model.
void CopyGrads(const Params& from, const Params& to, torch::Dtype dtype) {
  for (std::size_t g = 0; g < from.size(); ++g) {
    for (std::size_t i = 0; i < from[g].size(); ++i) {
      const torch::Tensor& grad = from[g][i].grad();
      to[g][i].mutable_grad() = grad.defined() ? grad.detach().to(dtype).clone() : torch::Tensor();
    }
  }
}

// ---- ClipGradNorm / ClipGradValue ---------------------------------------------------------------

class TorchClipNorm : public ::testing::TestWithParam<std::tuple<double, torch::Dtype>> {};

// For torch::nn::utils::clip_grad_norm_: the params without zero-size grads (torch's inf-norm
// takes the max of every grad, which fails on an empty one; they add nothing to any norm).
std::vector<torch::Tensor> TorchClipParams(const Params& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : Flat(params)) {
    if (!p.grad().defined() || p.grad().numel() > 0) flat.push_back(p);
  }
  return flat;
}

// The reference is torch's clip_grad_norm_ on f64 copies of the grads: torch sums an f32 norm in
// f32 (about 1e-6..1e-5 relative error on these 40000-element grads) and rounds a 16-bit grad's
// norm to 16 bits, where the engine accumulates in double. torch on the grads' own dtype is checked
// at those precisions. SetGrads leaves some params without a grad: skipped, as torch does.
TEST_P(TorchClipNorm, MatchesTorch) {
  const auto [norm_type, dtype] = GetParam();
  for (const double max_norm : {1.0, 1e9}) {  // clipped, and a factor of exactly 1
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    const Params ours = MakeParams(7, dtype);
    SetGrads(ours, 3);
    const Params ref = CloneParams(ours);
    CopyGrads(ours, ref, torch::kDouble);
    const Params same_dtype = CloneParams(ours);
    CopyGrads(ours, same_dtype, dtype);

    const double norm = ClipGradNorm(Flat(ours), max_norm, norm_type);
    const double ref_norm =
        torch::nn::utils::clip_grad_norm_(TorchClipParams(ref), max_norm, norm_type);
    const double same_dtype_norm =
        torch::nn::utils::clip_grad_norm_(TorchClipParams(same_dtype), max_norm, norm_type);
    EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm);
    EXPECT_NEAR(norm, same_dtype_norm, (dtype == torch::kFloat ? 1e-5 : 1e-2) * ref_norm);
    EXPECT_GT(norm, 1.0);  // so max_norm 1 clips
    for (std::size_t g = 0; g < ours.size(); ++g) {
      for (std::size_t i = 0; i < ours[g].size(); ++i) {
        EXPECT_EQ(ours[g][i].grad().defined(), ref[g][i].grad().defined());
        if (ours[g][i].grad().defined()) {
          EXPECT_EQ(ours[g][i].grad().scalar_type(), dtype);
        }
      }
    }
    if (dtype == torch::kFloat) {
      ExpectClose(Grads(ours), Grads(ref), 1e-6);
      ExpectClose(Grads(ours), Grads(same_dtype), 1e-5);
    } else {
      // The engine multiplies in f32 and rounds once to 16 bits: within one bf16 ulp (2^-8
      // relative) of the exact product.
      ExpectClose(Grads(ours), Grads(ref), std::ldexp(1.0, -8));
    }
  }
}

// Named TorchClip/..., so ctest's TorchClip suite runs it.
INSTANTIATE_TEST_SUITE_P(TorchClip, TorchClipNorm,
                         ::testing::Combine(::testing::Values(1.0, 2.0, kInf),
                                            ::testing::Values(torch::kFloat, torch::kBFloat16)));

TEST(TorchClip, OtherNormTypeIsTorchs) {
  const Params ours = MakeParams(8);
  SetGrads(ours, 1);
  const Params ref = CloneParams(ours);
  CopyGrads(ours, ref, torch::kFloat);
  EXPECT_EQ(ClipGradNorm(Flat(ours), 1.0, 3.0),
            torch::nn::utils::clip_grad_norm_(Flat(ref), 1.0, 3.0));
  EXPECT_TRUE(BitwiseEqual(Grads(ours), Grads(ref)));
}

TEST(TorchClip, NoGradsReturnsZero) {
  torch::Tensor w = torch::randn({3}).requires_grad_(true);
  EXPECT_EQ(ClipGradNorm({w}, 1.0), 0.0);
  EXPECT_FALSE(w.grad().defined());
}

TEST(TorchClip, NonFiniteNorm) {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    const Params ours = MakeParams(9);
    SetGrads(ours, 0);
    ours[0][1].grad()[2][3] = bad;
    const Params before = Grads(ours);
    // error_if_nonfinite: torch's message, grads unchanged.
    try {
      ClipGradNorm(Flat(ours), 1.0, 2.0, /*error_if_nonfinite=*/true);
      ADD_FAILURE() << "no c10::Error thrown";
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("The total norm of order 2 for gradients from `parameters` is "
                             "non-finite, so it cannot be clipped"),
                std::string::npos)
          << message;
    }
    const Params after = Grads(ours);
    for (std::size_t g = 0; g < ours.size(); ++g) {
      for (std::size_t i = 0; i < ours[g].size(); ++i) {
        EXPECT_TRUE(torch::allclose(after[g][i], before[g][i], 0.0, 0.0, /*equal_nan=*/true));
      }
    }
    // Without it: scaled by torch's factor (0 for an Inf norm, NaN for a NaN one).
    const Params ref = CloneParams(ours);
    CopyGrads(ours, ref, torch::kFloat);
    const double norm = ClipGradNorm(Flat(ours), 1.0);
    const double ref_norm = torch::nn::utils::clip_grad_norm_(Flat(ref), 1.0);
    EXPECT_EQ(std::isnan(norm), std::isnan(ref_norm));
    if (!std::isnan(ref_norm)) {
      EXPECT_EQ(norm, ref_norm);
    }
    const Params ours_grads = Grads(ours);
    const Params ref_grads = Grads(ref);
    for (std::size_t g = 0; g < ours.size(); ++g) {
      for (std::size_t i = 0; i < ours[g].size(); ++i) {
        EXPECT_TRUE(torch::allclose(ours_grads[g][i], ref_grads[g][i], 0.0, 0.0, true));
      }
    }
  }
}

TEST(TorchClip, ValueMatchesTorch) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    const Params ours = MakeParams(10, dtype);
    SetGrads(ours, 2);
    ours[1][0].grad()[5][1] = std::nanf("");
    const Params ref = CloneParams(ours);
    CopyGrads(ours, ref, dtype);
    ClipGradValue(Flat(ours), 0.5);
    torch::nn::utils::clip_grad_value_(Flat(ref), 0.5);
    const Params ours_grads = Grads(ours);
    const Params ref_grads = Grads(ref);
    for (std::size_t g = 0; g < ours.size(); ++g) {
      for (std::size_t i = 0; i < ours[g].size(); ++i) {
        EXPECT_TRUE(torch::allclose(ours_grads[g][i], ref_grads[g][i], 0.0, 0.0, true))
            << "param_groups[" << g << "].params[" << i << "]";
      }
    }
    EXPECT_LE(ours[0][2].grad().abs().max().item<double>(), 0.5);
  }
}

TEST(TorchClip, InvalidArguments) {
  torch::Tensor w = torch::randn({3}).requires_grad_(true);
  w.mutable_grad() = torch::randn({3});
  EXPECT_THROW(ClipGradNorm({w}, -1.0), c10::Error);
  EXPECT_THROW(ClipGradValue({w}, -1.0), c10::Error);
}

// ---- training() options -------------------------------------------------------------------------

constexpr int kTrainSteps = 6;

// max_grad_norm in the step equals clipping the grads with the engine (ClipGradNorm: the same
// norm, so the same f32 factor) and then a plain step, bit for bit: the step multiplies each grad
// element by the factor in f32 as it reads it. torch's clip_grad_norm_ sums the norm in f32 (a few
// 1e-6 relative off here), so its factor differs slightly and the params agree normwise only
// (Adam-type updates amplify the relative change of a grad that nearly cancels its weight decay).
template <class Fused, class Options>
void ExpectClipInStep(const Options& options, NormType type, double norm_type) {
  const Params a = MakeParams(11);
  const Params b = CloneParams(a);
  const Params c = CloneParams(a);
  Fused fa(MakeGroups(a, options), options);
  Fused fb(MakeGroups(b, options), options);
  Fused fc(MakeGroups(c, options), options);
  fa.training().max_grad_norm = 1.0;
  fa.training().norm_type = type;
  for (int t = 0; t < kTrainSteps; ++t) {
    for (const Params* p : {&a, &b, &c}) SetGrads(*p, t);
    fa.step();
    const double norm = ClipGradNorm(Flat(b), 1.0, norm_type);
    fb.step();
    const double torch_norm = torch::nn::utils::clip_grad_norm_(TorchClipParams(c), 1.0, norm_type);
    fc.step();
    EXPECT_NEAR(torch_norm, norm, 1e-5 * norm);
    const StepResult& r = fa.last_step();
    EXPECT_TRUE(r.stepped);
    EXPECT_FALSE(r.found_inf);
    ASSERT_TRUE(r.grad_norm.has_value());
    EXPECT_EQ(*r.grad_norm, norm);
    EXPECT_LT(r.clip_coef, 1.0f);
    EXPECT_FALSE(fb.last_step().grad_norm.has_value());  // no pre-pass without options
  }
  EXPECT_TRUE(BitwiseEqual(a, b)) << "max rel diff " << MaxRelDiff(a, b);
  ExpectCloseNormwise(a, c, 1e-4);
  // The step did not write the grads.
  const Params fresh = CloneParams(a);
  SetGrads(fresh, kTrainSteps - 1);
  EXPECT_TRUE(BitwiseEqual(Grads(a), Grads(fresh)));
}

TEST(TorchTraining, ClipInStepSgd) {
  ExpectClipInStep<SGD>(torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2),
                        NormType::kL2, 2.0);
}
TEST(TorchTraining, ClipInStepAdam) {
  ExpectClipInStep<Adam>(torch::optim::AdamOptions(1e-2).weight_decay(1e-2), NormType::kL2, 2.0);
}
TEST(TorchTraining, ClipInStepAdamWL1) {
  ExpectClipInStep<AdamW>(torch::optim::AdamWOptions(1e-2), NormType::kL1, 1.0);
}
TEST(TorchTraining, ClipInStepRmspropInf) {
  ExpectClipInStep<RMSprop>(torch::optim::RMSpropOptions(1e-2).momentum(0.5), NormType::kInf, kInf);
}
TEST(TorchTraining, ClipInStepAdagrad) {
  ExpectClipInStep<Adagrad>(torch::optim::AdagradOptions(0.1), NormType::kL2, 2.0);
}

// Step counts of a model's Adam/RMSprop/Adagrad states, in param order (-1: no state).
template <class State>
std::vector<std::int64_t> StepCounts(torch::optim::Optimizer& opt, const Params& params) {
  std::vector<std::int64_t> steps;
  for (const auto& p : Flat(params)) {
    auto it = opt.state().find(p.unsafeGetTensorImpl());
    steps.push_back(it == opt.state().end() ? -1 : static_cast<State&>(*it->second).step());
  }
  return steps;
}

// A scripted run: grads are multiplied by the scaler's scale (a power of two, so unscaling is
// exact), Inf/NaN injected on some steps. The scaled model must equal a plain model that only
// takes the good steps, bit for bit; a skipped step changes nothing; the scale follows
// GradScaler's policy.
template <class Fused, class State, class Options>
void ExpectScalerSkips(const Options& options) {
  const Params a = MakeParams(12);
  const Params b = CloneParams(a);
  Fused fa(MakeGroups(a, options), options);
  Fused fb(MakeGroups(b, options), options);
  LossScaler scaler({.init_scale = 1024.0f, .growth_interval = 2});
  fa.training().scaler = &scaler;

  // t -> what to inject into param_groups[0].params[1][1][2] (0: nothing).
  const float inf = std::numeric_limits<float>::infinity();
  // (that param has a grad on these steps: HasGrad).
  const std::vector<float> inject = {inf, 0, 0, 0, -inf, std::nanf(""), 0, 0, 0, 0};
  float expected_scale = 1024.0f;
  int good_in_a_row = 0;
  for (int t = 0; t < static_cast<int>(inject.size()); ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    SetGrads(a, t);
    SetGrads(b, t);
    for (const auto& p : Flat(a)) {
      if (p.grad().defined()) p.mutable_grad().mul_(scaler.scale());
    }
    if (inject[t] != 0) a[0][1].grad()[1][2] = inject[t];
    const Params before = CloneParams(a);
    const std::vector<std::int64_t> steps_before = StepCounts<State>(fa, a);
    const std::size_t states_before = fa.state().size();
    EXPECT_EQ(scaler.scale(), expected_scale);

    fa.step();
    const bool skip = inject[t] != 0;
    EXPECT_EQ(fa.last_step().stepped, !skip);
    EXPECT_EQ(fa.last_step().found_inf, skip);
    if (skip) {
      EXPECT_TRUE(BitwiseEqual(a, before));
      EXPECT_EQ(StepCounts<State>(fa, a), steps_before);
      EXPECT_EQ(fa.state().size(), states_before);  // t = 0: still no state at all
      expected_scale *= 0.5f;
      good_in_a_row = 0;
    } else {
      fb.step();
      if (++good_in_a_row == 2) {
        expected_scale *= 2.0f;
        good_in_a_row = 0;
      }
    }
    EXPECT_EQ(scaler.scale(), expected_scale);
    EXPECT_TRUE(BitwiseEqual(a, b)) << "max rel diff " << MaxRelDiff(a, b);
    EXPECT_EQ(StepCounts<State>(fa, a), StepCounts<State>(fb, b));
  }
  EXPECT_EQ(fa.state().size(), fb.state().size());
}

TEST(TorchTraining, ScalerSkipsAdam) {
  ExpectScalerSkips<Adam, torch::optim::AdamParamState>(
      torch::optim::AdamOptions(1e-2).amsgrad(true));
}
TEST(TorchTraining, ScalerSkipsRmsprop) {
  ExpectScalerSkips<RMSprop, torch::optim::RMSpropParamState>(
      torch::optim::RMSpropOptions(1e-2).centered(true).momentum(0.9));
}

// SGD keeps no step count; its momentum buffers must still appear only on a taken step.
TEST(TorchTraining, ScalerSkipsSgdFirstStep) {
  torch::Tensor w = torch::randn({100}).requires_grad_(true);
  const torch::Tensor w0 = w.detach().clone();
  SGD opt({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  LossScaler scaler;
  opt.set_training({.scaler = &scaler, .max_grad_norm = 10.0});
  w.mutable_grad() = torch::randn({100});
  w.mutable_grad()[7] = std::nanf("");
  opt.step();
  EXPECT_FALSE(opt.last_step().stepped);
  EXPECT_TRUE(opt.state().empty());
  EXPECT_TRUE(torch::equal(w.detach(), w0));
  EXPECT_EQ(scaler.scale(), 32768.0f);
}

TEST(TorchTraining, DefaultsArePlainStep) {
  const torch::optim::AdamWOptions options(1e-2);
  const Params a = MakeParams(13);
  const Params b = CloneParams(a);
  AdamW fa(MakeGroups(a, options), options);
  AdamW fb(MakeGroups(b, options), options);
  fa.set_training(TrainingOptions{});
  for (int t = 0; t < 3; ++t) {
    SetGrads(a, t);
    SetGrads(b, t);
    fa.step();
    fb.step();
    EXPECT_TRUE(fa.last_step().stepped);
    EXPECT_FALSE(fa.last_step().grad_norm.has_value());
  }
  EXPECT_TRUE(BitwiseEqual(a, b));
}

TEST(TorchTraining, InvalidOptionsChangeNothing) {
  torch::Tensor w = torch::randn({10}).requires_grad_(true);
  const torch::Tensor w0 = w.detach().clone();
  LossScaler scaler;
  Adam opt({w}, torch::optim::AdamOptions(1e-2));
  w.mutable_grad() = torch::randn({10});
  opt.training().max_grad_norm = -1.0;
  EXPECT_THROW(opt.step(), c10::Error);
  // An invalid hyper-parameter is reported even when the grads overflow; the scaler is untouched.
  opt.set_training({.scaler = &scaler});
  static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options()).lr(-1.0);
  w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(opt.step(), c10::Error);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_TRUE(opt.state().empty());
  EXPECT_TRUE(torch::equal(w.detach(), w0));
}

// ---- Gradient accumulation (training().accumulation_steps) --------------------------------------

// A window of kWindow micro-batches must equal one plain step on the f32 sums, as the core adds
// them (fusedopt::AccumulateGrads: grad · f32(1 / kWindow), the product and the sum each rounded
// once), bit for bit, clipping included; the micro-batches before the last change nothing; a param
// with a grad in only some of them (SetGrads leaves some out) steps from the sum of those; one
// without a grad in the whole window gets no state. f32 runs are also compared with torch::optim's
// twin stepping on those sums.
template <class Fused, class Twin, class Options>
void ExpectAccumulationStepsOnTheSums(const Options& options, torch::Dtype dtype,
                                      double max_grad_norm) {
  constexpr int kWindow = 3;
  const Params a = MakeParams(21, dtype);
  const Params b = CloneParams(a);
  const Params c = CloneParams(a);
  Fused fa(MakeGroups(a, options), options);
  Fused fb(MakeGroups(b, options), options);
  Twin twin(MakeGroups(c, options), options);
  fa.training().accumulation_steps = kWindow;
  fa.training().max_grad_norm = max_grad_norm;
  fb.training().max_grad_norm = max_grad_norm;
  const float scale = static_cast<float>(1.0 / kWindow);
  const std::vector<torch::Tensor> flat_a = Flat(a);
  for (int window = 0; window < 2; ++window) {
    std::vector<torch::Tensor> sums(flat_a.size());
    for (int j = 0; j < kWindow; ++j) {
      SCOPED_TRACE("window " + std::to_string(window) + ", micro-batch " + std::to_string(j));
      SetGrads(a, window * kWindow + j);
      for (std::size_t k = 0; k < flat_a.size(); ++k) {
        if (!flat_a[k].grad().defined()) continue;
        const torch::Tensor add = flat_a[k].grad().to(torch::kFloat) * scale;
        sums[k] = sums[k].defined() ? sums[k] + add : add;
      }
      const Params before = CloneParams(a);
      const std::size_t states_before = fa.state().size();
      fa.step();
      EXPECT_EQ(fa.pending_micro_batches(), (j + 1) % kWindow);
      EXPECT_EQ(fa.last_step().stepped, j + 1 == kWindow);
      if (j + 1 < kWindow) {
        EXPECT_TRUE(BitwiseEqual(a, before));
        EXPECT_EQ(fa.state().size(), states_before);
      }
    }
    const std::vector<torch::Tensor> flat_b = Flat(b);
    const std::vector<torch::Tensor> flat_c = Flat(c);
    for (std::size_t k = 0; k < flat_b.size(); ++k) {
      flat_b[k].mutable_grad() = sums[k].defined() ? sums[k].clone() : torch::Tensor();
      flat_c[k].mutable_grad() = sums[k].defined() ? sums[k].clone() : torch::Tensor();
    }
    fb.step();
    EXPECT_TRUE(BitwiseEqual(a, b)) << "max rel diff " << MaxRelDiff(a, b);
    EXPECT_EQ(fa.state().size(), fb.state().size());
    if (dtype == torch::kFloat) {
      if (std::isfinite(max_grad_norm)) ClipGradNorm(flat_c, max_grad_norm);
      twin.step();
      ExpectClose(a, c, 1e-5);
    }
  }
}

TEST(TorchTraining, AccumulationStepsOnTheSumsAdamW) {
  ExpectAccumulationStepsOnTheSums<AdamW, torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).amsgrad(true), torch::kFloat, kInf);
}
TEST(TorchTraining, AccumulationStepsOnTheSumsSgdClipped) {
  ExpectAccumulationStepsOnTheSums<SGD, torch::optim::SGD>(
      torch::optim::SGDOptions(1e-2).momentum(0.9), torch::kFloat, 1.0);
}
TEST(TorchTraining, AccumulationStepsOnTheSumsAdamBf16) {
  ExpectAccumulationStepsOnTheSums<Adam, torch::optim::Adam>(torch::optim::AdamOptions(1e-2),
                                                             torch::kBFloat16, kInf);
}

// With a scaler, each micro-batch is unscaled by the scale of its own backward and updates the
// scaler; a window where one micro-batch held Inf/NaN is skipped whole at its last step(), leaving
// params and states as they were; the next window steps.
TEST(TorchTraining, AccumulationSkipsAWindowWithAnInf) {
  torch::Tensor w = torch::randn({300}).requires_grad_(true);
  AdamW opt({w}, torch::optim::AdamWOptions(1e-2));
  LossScaler scaler({.init_scale = 1024.0f});
  opt.set_training({.scaler = &scaler, .accumulation_steps = 2});
  const float inf = std::numeric_limits<float>::infinity();
  const auto micro_batch = [&](int t, bool poison) {
    torch::manual_seed(static_cast<std::uint64_t>(t));
    w.mutable_grad() = torch::randn({300}) * scaler.scale();
    if (poison) w.mutable_grad()[5] = inf;
    opt.step();
  };
  const torch::Tensor w0 = w.detach().clone();
  micro_batch(0, true);  // the first micro-batch overflows: the scaler backs off at once
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(opt.last_step().found_inf);
  micro_batch(1, false);  // closes the window: skipped
  EXPECT_FALSE(opt.last_step().stepped);
  EXPECT_EQ(opt.pending_micro_batches(), 0);
  EXPECT_TRUE(torch::equal(w.detach(), w0));
  EXPECT_TRUE(opt.state().empty());
  micro_batch(2, false);
  micro_batch(3, true);  // the last one overflows
  EXPECT_FALSE(opt.last_step().stepped);
  EXPECT_EQ(scaler.scale(), 256.0f);
  EXPECT_TRUE(torch::equal(w.detach(), w0));
  EXPECT_TRUE(opt.state().empty());
  micro_batch(4, false);
  micro_batch(5, false);
  EXPECT_TRUE(opt.last_step().stepped);
  EXPECT_FALSE(torch::equal(w.detach(), w0));
  EXPECT_EQ(opt.state().size(), 1u);
}

// Refusals leave the params, the states and the window as they were.
TEST(TorchTraining, AccumulationRefusalsChangeNothing) {
  torch::Tensor w = torch::randn({50}).requires_grad_(true);
  torch::Tensor d = torch::randn({4}, torch::kDouble).requires_grad_(true);
  Adam opt({w}, torch::optim::AdamOptions(1e-2));
  w.mutable_grad() = torch::randn({50});
  const torch::Tensor w0 = w.detach().clone();
  opt.training().accumulation_steps = 0;
  ExpectTorchError([&] { opt.step(); }, {"invalid accumulation_steps 0"});
  opt.training().accumulation_steps = 2;
  auto& options = static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options());
  options.lr(-1.0);  // a micro-batch that opens a window is checked as its last one will be
  EXPECT_THROW(opt.step(), c10::Error);
  EXPECT_EQ(opt.pending_micro_batches(), 0);
  options.lr(1e-2);
  opt.step();  // one micro-batch in
  EXPECT_EQ(opt.pending_micro_batches(), 1);
  opt.training().accumulation_steps = 3;
  ExpectTorchError([&] { opt.step(); }, {"accumulation_steps changed from 2 to 3 inside a window"});
  opt.training().accumulation_steps = 2;
  options.lr(-1.0);
  EXPECT_THROW(opt.step(), c10::Error);  // the window's last step checks its options first
  EXPECT_EQ(opt.pending_micro_batches(), 1);
  EXPECT_TRUE(torch::equal(w.detach(), w0));
  EXPECT_TRUE(opt.state().empty());
  options.lr(1e-2);
  opt.step();
  EXPECT_TRUE(opt.last_step().stepped);

  // Clipping needs every param on the fused path: a param that takes torch::optim's own step
  // (float64) in the window is refused with it.
  opt.add_param_group(torch::optim::OptimizerParamGroup({d}));
  d.mutable_grad() = torch::randn({4}, torch::kDouble);
  opt.training().max_grad_norm = 1.0;
  const torch::Tensor w1 = w.detach().clone();
  const torch::Tensor d1 = d.detach().clone();
  ExpectTorchError([&] { opt.step(); },
                   {"max_grad_norm 1 with training().accumulation_steps > 1 needs every param on "
                    "the fused path",
                    "param_groups[1].params[0]: its dtype is Double"});
  EXPECT_EQ(opt.pending_micro_batches(), 0);
  EXPECT_TRUE(torch::equal(w.detach(), w1));
  EXPECT_TRUE(torch::equal(d.detach(), d1));
}

// A param that takes torch::optim's own step (float64 here) accumulates in torch: its sum is grad ·
// (1 / k) in float64 (the first one as it is), and the window's last step() runs the twin's step on
// the sums, bit for bit; the fused params step from their f32 sums (compared with the twin on those
// sums). Checkpoints and torch::save archives saved mid-window keep the routed sums: the run loaded
// from them ends the same.
TEST(TorchTraining, AccumulationSumsRoutedParamsInTorch) {
  constexpr int kWindow = 3;
  const torch::optim::AdamWOptions options(1e-2);
  const std::string path = ::testing::TempDir() + "/routed_accumulation.safetensors";
  Params a = MakeParams(31);
  for (auto& p : a[1]) p = p.detach().to(torch::kDouble).requires_grad_(true);
  const Params c = CloneParams(a);
  auto fused = std::make_unique<AdamW>(MakeGroups(a, options), options);
  fused->training().accumulation_steps = kWindow;
  torch::optim::AdamW twin(MakeGroups(c, options), options);
  const std::vector<torch::Tensor> flat_a = Flat(a);
  const std::vector<torch::Tensor> flat_c = Flat(c);
  for (int window = 0; window < 2; ++window) {
    std::vector<torch::Tensor> sums(flat_a.size());
    for (int j = 0; j < kWindow; ++j) {
      SCOPED_TRACE("window " + std::to_string(window) + ", micro-batch " + std::to_string(j));
      if (j > 0) {  // saved inside the window (a checkpoint, or torch::save), loaded into a new one
        std::stringstream archive;
        if (window == 0) {
          torch::save(*fused, archive);
        } else {
          SaveCheckpoint(*fused, path);
          for (const auto& p : flat_a) p.detach().zero_();  // the file restores them
        }
        fused = std::make_unique<AdamW>(MakeGroups(a, options), options);
        fused->training().accumulation_steps = kWindow;
        if (window == 0) {
          torch::load(*fused, archive);
        } else {
          LoadCheckpoint(*fused, path);
        }
        EXPECT_EQ(fused->pending_micro_batches(), j);
      }
      SetGrads(a, window * kWindow + j);
      for (std::size_t k = 0; k < flat_a.size(); ++k) {
        const torch::Tensor& grad = flat_a[k].grad();
        if (!grad.defined()) continue;
        const torch::Tensor add = grad.scalar_type() == torch::kDouble
                                      ? grad * (1.0 / kWindow)
                                      : grad * static_cast<float>(1.0 / kWindow);
        sums[k] = sums[k].defined() ? sums[k] + add : add;
      }
      fused->step();
      EXPECT_EQ(fused->last_step().stepped, j + 1 == kWindow);
    }
    for (std::size_t k = 0; k < flat_c.size(); ++k) {
      flat_c[k].mutable_grad() = sums[k].defined() ? sums[k].clone() : torch::Tensor();
    }
    twin.step();
    EXPECT_TRUE(BitwiseEqual(Params{a[1]}, Params{c[1]}));  // the routed (float64) group
    ExpectClose(Params{a[0]}, Params{c[0]}, 1e-5);
  }
}

// With a scaler, an Inf in a routed param's gradient is its micro-batch's overflow: the scaler
// backs off and the window is skipped whole, the routed param too.
TEST(TorchTraining, AccumulationSkipsAWindowWithARoutedInf) {
  torch::Tensor w = torch::randn({30}).requires_grad_(true);
  torch::Tensor d = torch::randn({4}, torch::kDouble).requires_grad_(true);
  AdamW opt({w, d}, torch::optim::AdamWOptions(1e-2));
  LossScaler scaler({.init_scale = 1024.0f});
  opt.set_training({.scaler = &scaler, .accumulation_steps = 2});
  const auto micro_batch = [&](int t, bool poison) {
    torch::manual_seed(static_cast<std::uint64_t>(t));
    w.mutable_grad() = torch::randn({30}) * scaler.scale();
    d.mutable_grad() = torch::randn({4}, torch::kDouble) * scaler.scale();
    if (poison) d.mutable_grad()[1] = std::numeric_limits<double>::infinity();
    opt.step();
  };
  const torch::Tensor w0 = w.detach().clone();
  const torch::Tensor d0 = d.detach().clone();
  micro_batch(0, true);
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(opt.last_step().found_inf);
  micro_batch(1, false);  // closes the window: skipped
  EXPECT_FALSE(opt.last_step().stepped);
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(torch::equal(w.detach(), w0));
  EXPECT_TRUE(torch::equal(d.detach(), d0));
  EXPECT_TRUE(opt.state().empty());
  micro_batch(2, false);
  micro_batch(3, false);
  EXPECT_TRUE(opt.last_step().stepped);
  EXPECT_FALSE(torch::equal(w.detach(), w0));
  EXPECT_FALSE(torch::equal(d.detach(), d0));
  EXPECT_EQ(opt.state().size(), 2u);
}

// SaveCheckpoint inside a window keeps it (the sums, how far it is), as fusedopt.save_checkpoint
// does, and so do torch::save and torch::load: a run resumed from such a file ends with the
// uninterrupted run's bits. An optimizer that cannot continue the window refuses the file.
TEST(TorchTraining, AccumulationWindowSurvivesACheckpoint) {
  const torch::optim::AdamWOptions options(1e-2);
  const std::string path = ::testing::TempDir() + "/accumulation.safetensors";
  enum class Resume { kNo, kCheckpoint, kTorchSave };
  const auto run = [&](Resume resume) {
    Params params = MakeParams(23);
    auto opt = std::make_unique<AdamW>(MakeGroups(params, options), options);
    opt->training().accumulation_steps = 3;
    for (int t = 0; t < 8; ++t) {
      if (resume != Resume::kNo && t == 5) {  // 2 of 3 micro-batches into the second window
        std::stringstream archive;
        if (resume == Resume::kCheckpoint) {
          SaveCheckpoint(*opt, path);
          for (const auto& p : Flat(params)) p.detach().zero_();  // the file restores them
        } else {
          torch::save(*opt, archive);
        }
        opt = std::make_unique<AdamW>(MakeGroups(params, options), options);
        opt->training().accumulation_steps = 3;
        if (resume == Resume::kCheckpoint) {
          LoadCheckpoint(*opt, path);
        } else {
          torch::load(*opt, archive);
        }
        EXPECT_EQ(opt->pending_micro_batches(), 2);
      }
      SetGrads(params, t);
      opt->step();
    }
    EXPECT_EQ(opt->pending_micro_batches(), 2);
    return params;
  };
  const Params whole = run(Resume::kNo);
  EXPECT_TRUE(BitwiseEqual(run(Resume::kCheckpoint), whole));
  EXPECT_TRUE(BitwiseEqual(run(Resume::kTorchSave), whole));

  const Params params = MakeParams(23);
  torch::optim::AdamW twin(MakeGroups(params, options), options);
  EXPECT_THROW(LoadCheckpoint(twin, path), CheckpointError);
  AdamW shorter(MakeGroups(params, options), options);
  shorter.training().accumulation_steps = 2;
  EXPECT_THROW(LoadCheckpoint(shorter, path), CheckpointError);
  EXPECT_EQ(shorter.pending_micro_batches(), 0);

  AdamW inside(MakeGroups(params, options), options);
  inside.training().accumulation_steps = 3;
  SetGrads(params, 0);
  inside.step();
  std::stringstream archive;
  torch::save(inside, archive);
  ExpectTorchError([&] { torch::load(shorter, archive); },
                   {"the archive is 1 micro-batches into an accumulation window of 3; "
                    "training().accumulation_steps is 2"});
  EXPECT_EQ(shorter.pending_micro_batches(), 0);
  EXPECT_TRUE(shorter.state().empty());
  std::stringstream again;  // torch::optim's own class takes the archive, without the window
  torch::save(inside, again);
  EXPECT_NO_THROW(torch::load(twin, again));
}

// ---- Stochastic rounding ------------------------------------------------------------------------

// Pure bf16 params at 1.0 (ulp 2^-7), each step moving them by 1e-4: over 200 steps stochastic
// rounding must move almost every element, with a mean near the exact -0.02, which it does only
// when the noise changes every step. SGD and Lion keep no step count that torch saves: their noise
// follows rounding_step (SgdParamState's; HyperParamState::step), which a torch::save / torch::load
// halfway carries on (the resumed run ends with the same bits). Keyed by SGD's fresh-buffer flag,
// 2.5 % of the elements took every step and the rest none.
template <class Optimizer, class Options>
void ExpectSubUlpUpdatesFollowed(const Options& options, double grad) {
  const auto run = [&](bool resume) {
    torch::Tensor p = torch::ones({4096}, torch::kBFloat16).requires_grad_(true);
    auto opt = std::make_unique<Optimizer>(std::vector<torch::Tensor>{p}, options);
    opt->training().stochastic_rounding = true;
    opt->training().rounding_seed = 3;
    for (int t = 0; t < 200; ++t) {
      if (resume && t == 100) {
        std::stringstream buffer;
        torch::save(*opt, buffer);
        opt = std::make_unique<Optimizer>(std::vector<torch::Tensor>{p}, options);
        opt->training().stochastic_rounding = true;
        opt->training().rounding_seed = 3;
        torch::load(*opt, buffer);
      }
      p.mutable_grad() = torch::full_like(p, grad);
      opt->step();
    }
    return p.detach().to(torch::kFloat) - 1.0;
  };
  const torch::Tensor change = run(false);
  EXPECT_GT(change.ne(0).to(torch::kFloat).mean().item<double>(), 0.9);
  EXPECT_NEAR(change.mean().item<double>(), -0.02, 0.002);
  EXPECT_TRUE(torch::equal(run(true), change));
}

TEST(TorchTraining, SgdStochasticRoundingFollowsSubUlpUpdates) {
  ExpectSubUlpUpdatesFollowed<SGD>(torch::optim::SGDOptions(1.0), 1e-4);
}
TEST(TorchTraining, SgdMomentumStochasticRoundingFollowsSubUlpUpdates) {
  ExpectSubUlpUpdatesFollowed<SGD>(torch::optim::SGDOptions(1.0).momentum(0.5).dampening(0.5),
                                   1e-4);
}
TEST(TorchTraining, LionStochasticRoundingFollowsSubUlpUpdates) {
  ExpectSubUlpUpdatesFollowed<Lion>(LionOptions(1e-4), 1.0);
}
TEST(TorchTraining, AdamStochasticRoundingFollowsSubUlpUpdates) {
  ExpectSubUlpUpdatesFollowed<Adam>(torch::optim::AdamOptions(1e-4), 1.0);
}

// ---- ApplySchedule ------------------------------------------------------------------------------

TEST(TorchSchedule, SetsEveryGroupsLr) {
  const Params params = MakeParams(14);
  const torch::optim::SGDOptions options(0.1);
  SGD opt(MakeGroups(params, options), options);
  const Schedule schedule = WarmupCosine(0.1, 5, 20, 1e-3);
  for (std::int64_t t = 0; t <= 20; ++t) {
    ApplySchedule(opt, schedule, t);
    for (auto& group : opt.param_groups()) EXPECT_EQ(group.options().get_lr(), schedule.Lr(t));
  }
  EXPECT_EQ(opt.param_groups()[0].options().get_lr(), 1e-3);
}

// A torch-like loop: per-group schedules (each group's base lr), opt.step() then the scheduler.
TEST(TorchSchedule, PerGroupSchedulesInALoop) {
  const Params params = MakeParams(15);
  const torch::optim::AdamOptions options(1e-2);
  Adam opt(MakeGroups(params, options, 0.3), options);
  const std::vector<Schedule> schedules = {CosineAnnealingLr(1e-2, 8), CosineAnnealingLr(3e-3, 8)};
  for (std::int64_t t = 0; t < 8; ++t) {
    ApplySchedule(opt, schedules, t);
    EXPECT_EQ(opt.param_groups()[0].options().get_lr(), schedules[0].Lr(t));
    EXPECT_EQ(opt.param_groups()[1].options().get_lr(), schedules[1].Lr(t));
    SetGrads(params, static_cast<int>(t));
    opt.step();
  }
  EXPECT_THROW(ApplySchedule(opt, std::vector<Schedule>{schedules[0]}, 0), c10::Error);
}

TEST(TorchSchedule, OneCycleMomentum) {
  const Schedule schedule = OneCycleLr({.max_lr = 0.1, .total_steps = 10});
  ASSERT_TRUE(schedule.has_momentum());
  torch::Tensor w = torch::randn({4}).requires_grad_(true);
  SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  Adam adam({w}, torch::optim::AdamOptions(0.1).betas({0.9, 0.98}));
  Adagrad adagrad({w}, torch::optim::AdagradOptions(0.1));
  for (std::int64_t t = 0; t < 10; ++t) {
    ApplySchedule(sgd, schedule, t);
    ApplySchedule(adam, schedule, t);
    const auto& s = static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
    const auto& a = static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options());
    EXPECT_EQ(s.lr(), schedule.Lr(t));
    EXPECT_EQ(s.momentum(), schedule.Momentum(t));
    EXPECT_EQ(a.lr(), schedule.Lr(t));
    EXPECT_EQ(std::get<0>(a.betas()), schedule.Momentum(t));
    EXPECT_EQ(std::get<1>(a.betas()), 0.98);
  }
  // Adagrad has no momentum: rejected, lr unchanged.
  EXPECT_THROW(ApplySchedule(adagrad, schedule, 3), c10::Error);
  EXPECT_EQ(adagrad.param_groups()[0].options().get_lr(), 0.1);
}

}  // namespace
}  // namespace fusedopt::pt::test
