// Optimizer::Step with the training-loop features (optimizer.h): loss scaling with overflow skips,
// clipping folded into the step, gradient accumulation, and the state memory each mode costs.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/scaler.h"
#include "fusedopt/training_step.h"

namespace fusedopt {
namespace {

const std::vector<TensorSpec> kTensors = {{.numel = 1000}, {.numel = 3}, {.numel = 70000}};

void FillParams(FlatStorage& st, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t t = 0; t < st.num_tensors(); ++t) {
    for (float& x : st.params<float>(t)) x = normal(rng);
  }
}

// Writes gradient `micro` of step `step`, times `scale`, into f32 grads.
void FillGrads(FlatStorage& st, int step, int micro, float scale) {
  std::mt19937 rng(1000u * static_cast<unsigned>(step) + static_cast<unsigned>(micro));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t t = 0; t < st.num_tensors(); ++t) {
    for (float& x : st.grads<float>(t)) x = normal(rng) * scale;
  }
}

// Everything a step may change, as bytes.
std::vector<unsigned char> Snapshot(AdamW& opt) {
  std::vector<unsigned char> out;
  auto append = [&](std::span<const float> v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    out.insert(out.end(), p, p + v.size_bytes());
  };
  for (std::size_t t = 0; t < opt.storage().num_tensors(); ++t) {
    append(opt.storage().params<float>(t));
    append(opt.storage().state<float>(t, kExpAvg));
    append(opt.storage().state<float>(t, kExpAvgSq));
    out.push_back(static_cast<unsigned char>(opt.step_count(t)));
  }
  return out;
}

TEST(TrainStep, OverflowSkipsTheStepBitExactlyAndBacksOffTheScale) {
  AdamW opt({AdamWHyper{.lr = 1e-2}}, kTensors);
  FillParams(opt.storage(), 1);
  LossScaler scaler({.init_scale = 1024.0f});
  for (int step = 1; step <= 3; ++step) {
    FillGrads(opt.storage(), step, 0, scaler.scale());
    ASSERT_TRUE(opt.Step({.scaler = &scaler}).stepped);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float special : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      FillGrads(opt.storage(), 9, 0, scaler.scale());
      opt.storage().grads<float>(t)[kTensors[t].numel - 1] = special;
      const auto before = Snapshot(opt);
      const float scale_before = scaler.scale();
      const StepResult r = opt.Step({.scaler = &scaler, .max_grad_norm = 1.0});
      EXPECT_FALSE(r.stepped);
      EXPECT_TRUE(r.found_inf);
      EXPECT_EQ(Snapshot(opt), before);
      EXPECT_EQ(scaler.scale(), scale_before / 2);
    }
  }
}

TEST(TrainStep, LossScaledClippedStepEqualsSeparatePasses) {
  AdamW fused({AdamWHyper{.lr = 1e-2}}, kTensors);
  AdamW plain({AdamWHyper{.lr = 1e-2}}, kTensors);
  FillParams(fused.storage(), 2);
  FillParams(plain.storage(), 2);
  LossScaler scaler({.init_scale = 256.0f});
  for (int step = 1; step <= 3; ++step) {
    FillGrads(fused.storage(), step, 0, scaler.scale());
    FillGrads(plain.storage(), step, 0, 1.0f);
    const StepResult r = fused.Step({.scaler = &scaler, .max_grad_norm = 10.0});
    ASSERT_TRUE(r.stepped);
    ASSERT_LT(r.clip_coef, 1.0f);
    std::vector<GradBuffer> grads;
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      grads.push_back({plain.storage().grads<float>(t).data(), kTensors[t].numel, DType::kF32});
    }
    const double norm = ClipGradNorm(grads, 10.0);
    EXPECT_EQ(*r.grad_norm, norm);
    plain.Step();
  }
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    const auto a = fused.storage().params<float>(t);
    const auto b = plain.storage().params<float>(t);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size_bytes()), 0) << "tensor " << t;
  }
}

TEST(TrainStep, AccumulationEqualsOneStepOnTheMeanGradient) {
  constexpr int kMicroBatches = 4;
  AdamW accumulated({AdamWHyper{.lr = 1e-2}}, kTensors, {.accumulation_steps = kMicroBatches});
  AdamW big_batch({AdamWHyper{.lr = 1e-2}}, kTensors);
  FillParams(accumulated.storage(), 3);
  FillParams(big_batch.storage(), 3);
  for (int step = 1; step <= 3; ++step) {
    std::vector<std::vector<double>> sum(kTensors.size());
    for (std::size_t t = 0; t < kTensors.size(); ++t) sum[t].assign(kTensors[t].numel, 0.0);
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      FillGrads(accumulated.storage(), step, micro, 1.0f);
      for (std::size_t t = 0; t < kTensors.size(); ++t) {
        const auto g = accumulated.storage().grads<float>(t);
        for (std::size_t i = 0; i < g.size(); ++i) sum[t][i] += g[i];
      }
      const StepResult r = accumulated.Step();
      EXPECT_EQ(r.stepped, micro == kMicroBatches - 1);
      EXPECT_EQ(accumulated.pending_micro_batches(), (micro + 1) % kMicroBatches);
    }
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      const auto g = big_batch.storage().grads<float>(t);
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = static_cast<float>(sum[t][i] / kMicroBatches);
    }
    big_batch.Step();
  }
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    EXPECT_EQ(accumulated.step_count(t), 3);
    const auto a = accumulated.storage().params<float>(t);
    const auto b = big_batch.storage().params<float>(t);
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-6 * std::max(1.0f, std::fabs(b[i]))) << t << " " << i;
    }
  }
}

TEST(TrainStep, AnOverflowingMicroBatchSkipsItsWholeWindow) {
  AdamW opt({AdamWHyper{}}, kTensors, {.accumulation_steps = 3});
  FillParams(opt.storage(), 4);
  LossScaler scaler({.init_scale = 64.0f});
  const auto before = Snapshot(opt);
  for (int micro = 0; micro < 3; ++micro) {
    FillGrads(opt.storage(), 1, micro, scaler.scale());
    if (micro == 1) opt.storage().grads<float>(2)[5] = std::numeric_limits<float>::infinity();
    const StepResult r = opt.Step({.scaler = &scaler});
    EXPECT_FALSE(r.stepped);
    EXPECT_EQ(r.found_inf, micro == 1);
  }
  EXPECT_EQ(Snapshot(opt), before);
  EXPECT_EQ(scaler.scale(), 32.0f);
  // The next window starts clean and steps.
  for (int micro = 0; micro < 3; ++micro) {
    FillGrads(opt.storage(), 2, micro, scaler.scale());
    EXPECT_EQ(opt.Step({.scaler = &scaler}).stepped, micro == 2);
  }
  EXPECT_EQ(opt.step_count(0), 1);
}

TEST(TrainStep, RejectsBadOptionsWithoutChangingAnything) {
  AdamW opt({AdamWHyper{}}, kTensors, {.accumulation_steps = 2});
  FillParams(opt.storage(), 5);
  const auto before = Snapshot(opt);
  EXPECT_THROW(opt.Step({.max_grad_norm = -1.0}), Error);
  const std::vector<std::size_t> some = {0};
  EXPECT_THROW(opt.StepTensors(some), Error);  // a tensor list with accumulation
  EXPECT_EQ(Snapshot(opt), before);
  EXPECT_EQ(opt.pending_micro_batches(), 0);
  EXPECT_THROW(AdamW({AdamWHyper{}}, kTensors, {.accumulation_steps = 0}), Error);
}

// Pure-bf16 SGD: updates of lr·grad = 1e-4 are below half a bf16 ulp of 1.0 (2^-8), so round to
// nearest even loses every one of them; stochastic rounding keeps them on average.
TEST(TrainStep, StochasticRoundingKeepsUpdatesBelowHalfAnUlp) {
  const std::vector<TensorSpec> tensors = {{.numel = 4096}, {.numel = 100}};
  auto run = [&](bool stochastic, int threads) {
    Runtime runtime(threads);
    SGD opt({SgdHyper{.lr = 1e-4}}, tensors,
            {.param_dtype = DType::kBF16,
             .grad_dtype = DType::kBF16,
             .state_dtype = DType::kBF16,
             .stochastic_rounding = stochastic,
             .rounding_seed = 7},
            runtime);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      for (auto& x : opt.storage().params<std::uint16_t>(t)) x = F32ToBF16(1.0f);
      for (auto& x : opt.storage().grads<std::uint16_t>(t)) x = F32ToBF16(1.0f);
    }
    for (int step = 0; step < 100; ++step) opt.Step();
    std::vector<std::uint16_t> out;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const auto p = opt.storage().params<std::uint16_t>(t);
      out.insert(out.end(), p.begin(), p.end());
    }
    return out;
  };
  const std::vector<std::uint16_t> nearest = run(false, 1);
  for (std::uint16_t x : nearest) ASSERT_EQ(BF16ToF32(x), 1.0f);  // every update lost
  const std::vector<std::uint16_t> stochastic = run(true, 1);
  double mean = 0.0;
  for (std::uint16_t x : stochastic) mean += BF16ToF32(x);
  mean /= static_cast<double>(stochastic.size());
  // Exact arithmetic: 1 - 100·1e-4 = 0.99. Each element is a sum of 100 rounding errors of up to
  // one ulp (2^-8 below 1): its standard deviation is below 2^-8·sqrt(100)/2 ≈ 0.02, the mean's
  // over 4196 elements below 3.1e-4; allow 5 sigma.
  EXPECT_NEAR(mean, 0.99, 1.6e-3);
  EXPECT_EQ(run(true, 2), stochastic);  // the same bits on any thread count
}

TEST(TrainStep, StateBytesPerParamOfEachMode) {
  EXPECT_EQ(AdamW({AdamWHyper{}}, kTensors).storage().state_bytes_per_param(), 8.0);
  EXPECT_EQ(AdamW({AdamWHyper{}}, kTensors,
                  {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true})
                .storage()
                .state_bytes_per_param(),
            12.0);
  EXPECT_EQ(
      AdamW({AdamWHyper{}}, kTensors,
            {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .state_dtype = DType::kBF16})
          .storage()
          .state_bytes_per_param(),
      4.0);
  EXPECT_EQ(AdamW({AdamWHyper{.amsgrad = true}}, kTensors, {.accumulation_steps = 4})
                .storage()
                .state_bytes_per_param(),
            16.0);
  EXPECT_EQ(SGD({SgdHyper{}}, kTensors).storage().state_bytes_per_param(), 0.0);
}

// The core's TrainingStep with a MicroBatch, over raw buffers as the Python package calls it: a
// sum that joins the window late is overwritten on its first micro-batch, not added to.
TEST(TrainStepMicroBatch, FreshFlagsOverwriteEachSumOnItsFirstMicroBatch) {
  const std::vector<SgdHyper> groups = {{.lr = 1.0}};  // param -= mean gradient
  std::vector<float> param = {1.0f, 2.0f}, g0 = {0.3f, -0.7f}, g1 = {0.1f, 0.9f};
  std::vector<float> sum0(2, 123.0f), sum1(2, -55.0f);  // stale values from an earlier window
  AccumulationWindow window{.steps = 3};
  const float scale = static_cast<float>(double{0.5f} / 3.0);  // grad_scale 0.5, 3 micro-batches
  std::vector<Segment> segments(1);
  segments[0] = {.param = param.data(), .grad = sum0.data(), .numel = 1};  // reads the sums
  std::vector<Segment> second = segments;
  second[0].param = param.data() + 1;
  second[0].grad = sum1.data();
  segments.push_back(second[0]);
  float* sums01[] = {sum0.data(), sum1.data()};
  const auto call = [&](std::vector<GradBuffer> grads, std::span<float* const> sums,
                        std::vector<std::uint8_t> fresh) {
    const MicroBatch batch{
        .window = &window, .grads = grads, .sums = sums, .fresh = fresh, .grad_scale = 0.5f};
    return TrainingStep(std::span<const SgdHyper>(groups), std::span<Segment>(segments),
                        {.micro_batch = &batch});
  };
  // Micro-batch 0: only the first element has a gradient; micro-batch 1: both, the second fresh.
  EXPECT_FALSE(call({{g0.data(), 1, DType::kF32}}, std::span(sums01, 1), {1}).stepped);
  EXPECT_FALSE(
      call({{g0.data(), 1, DType::kF32}, {g1.data() + 1, 1, DType::kF32}}, sums01, {0, 1}).stepped);
  EXPECT_EQ(window.pending, 2);
  const StepResult last =
      call({{g1.data(), 1, DType::kF32}, {g0.data() + 1, 1, DType::kF32}}, sums01, {0, 0});
  EXPECT_TRUE(last.stepped);
  EXPECT_EQ(window.pending, 0);
  // f32 as the engine computes it: each product rounded, then each sum.
  const float s0 = (g0[0] * scale + g0[0] * scale) + g1[0] * scale;
  const float s1 = g1[1] * scale + g0[1] * scale;
  EXPECT_EQ(sum0[0], s0);
  EXPECT_EQ(sum1[0], s1);
  EXPECT_EQ(param[0], 1.0f - s0);
  EXPECT_EQ(param[1], 2.0f - s1);
}

TEST(TrainStepMicroBatch, TheClosingCallValidatesTheStepBeforeAdding) {
  const std::vector<SgdHyper> groups = {{.lr = -1.0}};
  std::vector<float> param = {1.0f}, grad = {0.5f}, sum = {7.0f};
  AccumulationWindow window{.steps = 2, .pending = 1};
  std::vector<Segment> segments = {{.param = param.data(), .grad = sum.data(), .numel = 1}};
  const std::vector<GradBuffer> grads = {{grad.data(), 1, DType::kF32}};
  float* sums[] = {sum.data()};
  const MicroBatch batch{.window = &window, .grads = grads, .sums = sums};
  EXPECT_THROW(TrainingStep(std::span<const SgdHyper>(groups), std::span<Segment>(segments),
                            {.micro_batch = &batch}),
               Error);
  EXPECT_EQ(sum[0], 7.0f);
  EXPECT_EQ(param[0], 1.0f);
  EXPECT_EQ(window.pending, 1);
  AccumulationWindow bad{.steps = 2, .pending = 2};
  const MicroBatch past_the_end{.window = &bad, .grads = grads, .sums = sums};
  EXPECT_THROW(TrainingStep(std::span<const SgdHyper>(groups), std::span<Segment>(segments),
                            {.micro_batch = &past_the_end}),
               Error);
}

}  // namespace
}  // namespace fusedopt
