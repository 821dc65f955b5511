// fusedopt::pt::Lion and fusedopt::pt::LAMB have no torch::optim twin to compare with, so they are
// checked against two independent references:
//
//  - TorchLionLambParity: the double-precision oracle (tests/reference: ref::LionStep and
//    ref::LambStep, written from lion-pytorch's and apex FusedLAMB's formulas), step by step on the
//    shared test model (two groups; a zero-size tensor, small ones and a 40000-element tensor that
//    spans two of the core's chunks; params missing grads on some steps; an lr change half way).
//    Before each step the test reads the optimizer's f32 params and state, runs the oracle in
//    double from them with the options the test meant each group to have (not the optimizer's copy
//    of them), applying LAMB's global clipping itself (apex: g / (norm / max_grad_norm) when norm >
//    max_grad_norm); after the step it compares params (kParamTolerance), state (kStateTolerance)
//    and step counts, as relative errors floored at 1% of each tensor's largest magnitude (as
//    test_util.h's Compare). Params without a grad must stay bit-identical and get no state.
//
//    Lion's update is ±lr·sign(c), c = β1·m + (1 − β1)·g: where |c| is within rounding of zero
//    next to its terms, f32 and double may take different signs and the param then differs by
//    2·lr. Those elements' params (a handful in a run, counted and bounded) are left out of the
//    comparison; their exp_avg is not.
//
//  - the golden trajectories tests/golden/lion.json (lion-pytorch 0.2.5) and tests/golden/lamb.json
//    (tools/lamb_reference.py: apex FusedLAMB's formulas in torch ops, with its global
//    max_grad_norm), replayed through the classes as every generic class's are
//    (TorchGenericGolden, generic_test.cc).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/optim.h"
#include "tests/reference/reference.h"
#include "tests/torch/golden_replay.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

constexpr int kSteps = 20;
constexpr double kParamTolerance = 2e-6;
// The moments' running sums cancel (m = β·m + (1 − β)·g): an element at the 1% floor carries the
// f32 rounding of terms up to 100x larger.
constexpr double kStateTolerance = 1e-5;
// A Lion element whose |c| is below this fraction of |β1·m| + |(1 − β1)·g| may take either sign in
// f32 (its f32 error is below 2e-7 of that sum).
constexpr double kAmbiguousSign = 1e-6;

std::string Name(std::size_t g, std::size_t i) {
  return "param_groups[" + std::to_string(g) + "].params[" + std::to_string(i) + "]";
}

// The largest relative difference seen, where it was, and how many elements were compared.
struct Worst {
  double rel = 0.0;
  std::string where;
  long compared = 0;
};

// Relative difference of every element (skip: elements to leave out), floored at kFloorFraction
// of the reference's largest magnitude (test_util.h).
void CompareTo(const torch::Tensor& actual, const std::vector<double>& ref,
               const std::vector<bool>& skip, const std::string& what, Worst& worst) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_EQ(static_cast<std::size_t>(actual.numel()), ref.size()) << what;
  const std::vector<double> a = Doubles(actual);
  double scale = 0.0;
  for (const double r : ref) scale = std::max(scale, std::abs(r));
  const double floor = std::max(kFloorFraction * scale, 1e-30);
  for (std::size_t k = 0; k < ref.size(); ++k) {
    if (!skip.empty() && skip[k]) continue;
    ++worst.compared;
    double rel = std::abs(a[k] - ref[k]) / std::max(std::abs(ref[k]), floor);
    if (std::isnan(rel)) rel = kInf;
    if (rel > worst.rel) {
      worst.rel = rel;
      worst.where = what + "[" + std::to_string(k) + "]: " + std::to_string(a[k]) + " vs oracle " +
                    std::to_string(ref[k]);
    }
  }
}

// The optimizer over `params` with groups[g] as group g's options (groups[0] also the defaults).
template <class Optimizer, class Options>
Optimizer MakeOptimizer(const Params& params, const std::vector<Options>& groups) {
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (std::size_t g = 0; g < params.size(); ++g) {
    param_groups.emplace_back(params[g], std::make_unique<Options>(groups[g]));
  }
  return Optimizer(param_groups, groups[0]);
}

// Half way through, a scheduler halves group 0's lr: in the optimizer (through the generic
// OptimizerOptions interface) and in what the test means.
template <class Options>
void HalveLr(torch::optim::Optimizer& opt, std::vector<Options>& meant) {
  auto& options = opt.param_groups()[0].options();
  options.set_lr(options.get_lr() * 0.5);
  meant[0].lr(meant[0].lr() * 0.5);
}

// What one param must look like after the step.
struct Expected {
  bool stepped = false;
  std::vector<double> param, exp_avg, exp_avg_sq;
  std::vector<bool> skip;  // Lion: elements whose sign is ambiguous
  std::int64_t step = 0;
};

// ---- Lion against ref::LionStep -----------------------------------------------------------------

LionHyper OracleHyper(const LionOptions& o) {
  return {.lr = o.lr(),
          .beta1 = std::get<0>(o.betas()),
          .beta2 = std::get<1>(o.betas()),
          .weight_decay = o.weight_decay()};
}

void ExpectLionMatchesOracle(std::vector<LionOptions> meant) {
  Params params = MakeParams(21);
  Lion opt = MakeOptimizer<Lion>(params, meant);
  Worst param_worst;
  Worst exp_avg_worst;
  long ambiguous = 0;
  for (int t = 0; t < kSteps; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    if (t == kSteps / 2) HalveLr(opt, meant);
    SetGrads(params, t);
    const Params before = CloneParams(params);
    std::vector<std::vector<Expected>> expected(params.size());
    for (std::size_t g = 0; g < params.size(); ++g) {
      const LionHyper h = OracleHyper(meant[g]);
      for (const torch::Tensor& p : params[g]) {
        Expected& e = expected[g].emplace_back();
        if (!p.grad().defined()) continue;
        e.stepped = true;
        e.param = Doubles(p);
        const std::vector<double> grad = Doubles(p.grad());
        const auto* state = StateOf<LionParamState>(opt, p);
        e.exp_avg =
            state != nullptr ? Doubles(state->exp_avg()) : std::vector<double>(e.param.size());
        e.skip.resize(e.param.size());
        for (std::size_t k = 0; k < e.param.size(); ++k) {
          const double a = h.beta1 * e.exp_avg[k];
          const double b = (1.0 - h.beta1) * grad[k];
          const double terms = std::abs(a) + std::abs(b);
          e.skip[k] = terms > 0.0 && std::abs(a + b) <= kAmbiguousSign * terms;
          ambiguous += e.skip[k] ? 1 : 0;
        }
        ref::LionStep(h, e.param, grad, e.exp_avg);
      }
    }
    opt.step();
    for (std::size_t g = 0; g < params.size(); ++g) {
      for (std::size_t i = 0; i < params[g].size(); ++i) {
        const torch::Tensor& p = params[g][i];
        const Expected& e = expected[g][i];
        const auto* state = StateOf<LionParamState>(opt, p);
        if (!e.stepped) {
          EXPECT_TRUE(torch::equal(p.detach(), before[g][i].detach())) << Name(g, i);
          continue;
        }
        ASSERT_NE(state, nullptr) << Name(g, i);
        EXPECT_EQ(state->exp_avg().scalar_type(), torch::kFloat);
        CompareTo(p, e.param, e.skip, Name(g, i), param_worst);
        CompareTo(state->exp_avg(), e.exp_avg, {}, Name(g, i) + " exp_avg", exp_avg_worst);
      }
    }
  }
  EXPECT_LE(param_worst.rel, kParamTolerance) << "worst param: " << param_worst.where;
  EXPECT_LE(exp_avg_worst.rel, kStateTolerance) << "worst exp_avg: " << exp_avg_worst.where;
  // Sign-ambiguous elements are rare: about 2·kAmbiguousSign of the elements per step.
  EXPECT_LT(ambiguous, param_worst.compared / 10000 + 10);
  std::printf("[   info   ] Lion: %ld param elements compared, %ld left out (ambiguous sign)\n",
              param_worst.compared, ambiguous);
}

TEST(TorchLionLambParity, LionWeightDecay) {
  const auto group0 = LionOptions(1e-3).weight_decay(0.1);
  ExpectLionMatchesOracle({group0, LionOptions(group0).lr(3e-4)});
}

TEST(TorchLionLambParity, LionBetasPerGroup) {
  ExpectLionMatchesOracle({LionOptions(3e-3).betas({0.95, 0.98}),
                           LionOptions(1e-3).betas({0.8, 0.9}).weight_decay(0.5)});
}

// ---- LAMB against ref::LambStep -----------------------------------------------------------------

LambHyper OracleHyper(const LambOptions& o) {
  return {.lr = o.lr(),
          .beta1 = std::get<0>(o.betas()),
          .beta2 = std::get<1>(o.betas()),
          .eps = o.eps(),
          .weight_decay = o.weight_decay(),
          .bias_correction = o.bias_correction(),
          .adam_w_mode = o.adam_w_mode(),
          .grad_averaging = o.grad_averaging(),
          .use_nvlamb = o.use_nvlamb()};
}

// expect_clipped: whether the grads' norm exceeds max_grad_norm on every step (checked, so that a
// clipping case really clips).
void ExpectLambMatchesOracle(std::vector<LambOptions> meant, bool expect_clipped) {
  Params params = MakeParams(22);
  LAMB opt = MakeOptimizer<LAMB>(params, meant);
  const double max_grad_norm = meant[0].max_grad_norm();
  Worst param_worst;
  Worst exp_avg_worst;
  Worst exp_avg_sq_worst;
  for (int t = 0; t < kSteps; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    if (t == kSteps / 2) HalveLr(opt, meant);
    SetGrads(params, t);
    const Params before = CloneParams(params);

    // apex's global clipping over every gradient of the step.
    double square_sum = 0.0;
    for (const auto& group : params) {
      for (const torch::Tensor& p : group) {
        if (!p.grad().defined()) continue;
        for (const double x : Doubles(p.grad())) square_sum += x * x;
      }
    }
    const double norm = std::sqrt(square_sum);
    const double clip = norm > max_grad_norm ? max_grad_norm / norm : 1.0;

    std::vector<std::vector<Expected>> expected(params.size());
    for (std::size_t g = 0; g < params.size(); ++g) {
      const LambHyper h = OracleHyper(meant[g]);
      for (const torch::Tensor& p : params[g]) {
        Expected& e = expected[g].emplace_back();
        if (!p.grad().defined()) continue;
        e.stepped = true;
        e.param = Doubles(p);
        std::vector<double> grad = Doubles(p.grad());
        for (double& x : grad) x *= clip;
        const auto* state = StateOf<LambParamState>(opt, p);
        const std::size_t n = e.param.size();
        e.exp_avg = state != nullptr ? Doubles(state->exp_avg()) : std::vector<double>(n);
        e.exp_avg_sq = state != nullptr ? Doubles(state->exp_avg_sq()) : std::vector<double>(n);
        e.step = (state != nullptr ? state->step() : 0) + 1;
        ref::LambStep(h, e.step, e.param, grad, e.exp_avg, e.exp_avg_sq);
      }
    }
    opt.step();

    const StepResult& r = opt.last_step();
    EXPECT_TRUE(r.stepped);
    if (max_grad_norm == kInf) {
      EXPECT_FALSE(r.grad_norm.has_value());  // no pre-pass: nothing to clip, no scaler
    } else {
      ASSERT_TRUE(r.grad_norm.has_value());
      EXPECT_NEAR(*r.grad_norm, norm, 1e-12 * norm);
      EXPECT_NEAR(r.clip_coef, clip, 1e-6 * clip);
    }
    if (expect_clipped) {
      EXPECT_LT(clip, 1.0);
    }
    for (std::size_t g = 0; g < params.size(); ++g) {
      for (std::size_t i = 0; i < params[g].size(); ++i) {
        const torch::Tensor& p = params[g][i];
        const Expected& e = expected[g][i];
        const auto* state = StateOf<LambParamState>(opt, p);
        if (!e.stepped) {
          EXPECT_TRUE(torch::equal(p.detach(), before[g][i].detach())) << Name(g, i);
          continue;
        }
        ASSERT_NE(state, nullptr) << Name(g, i);
        EXPECT_EQ(state->step(), e.step) << Name(g, i);
        CompareTo(p, e.param, {}, Name(g, i), param_worst);
        CompareTo(state->exp_avg(), e.exp_avg, {}, Name(g, i) + " exp_avg", exp_avg_worst);
        CompareTo(state->exp_avg_sq(), e.exp_avg_sq, {}, Name(g, i) + " exp_avg_sq",
                  exp_avg_sq_worst);
      }
    }
  }
  EXPECT_LE(param_worst.rel, kParamTolerance) << "worst param: " << param_worst.where;
  EXPECT_LE(exp_avg_worst.rel, kStateTolerance) << "worst exp_avg: " << exp_avg_worst.where;
  EXPECT_LE(exp_avg_sq_worst.rel, kStateTolerance)
      << "worst exp_avg_sq: " << exp_avg_sq_worst.where;
}

// Both groups as group0, group 1's lr scaled (as test_util.h's MakeGroups).
std::vector<LambOptions> LrScaled(const LambOptions& group0) {
  return {group0, LambOptions(group0).lr(group0.lr() * 0.3)};
}

// The defaults clip (the test grads' global norm is far above 1) and decay weights.
TEST(TorchLionLambParity, LambDefaultsClip) {
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2)), /*expect_clipped=*/true);
}
TEST(TorchLionLambParity, LambNoClipping) {
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).max_grad_norm(kInf)), false);
}
TEST(TorchLionLambParity, LambThresholdAboveNorm) {  // the pre-pass runs, the factor is 1
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).max_grad_norm(1e9)), false);
}
TEST(TorchLionLambParity, LambNoBiasCorrection) {
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).bias_correction(false)), true);
}
TEST(TorchLionLambParity, LambL2Mode) {
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).adam_w_mode(false).weight_decay(0.05)), true);
}
TEST(TorchLionLambParity, LambNvlamb) {  // the trust ratio without weight decay
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).use_nvlamb(true).weight_decay(0.0)), true);
}
TEST(TorchLionLambParity, LambNoGradAveraging) {
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).grad_averaging(false).max_grad_norm(5.0)),
                          true);
}
// Group 1 differs in every field that may differ per group; without weight decay it takes plain
// Adam steps (no trust ratio).
TEST(TorchLionLambParity, LambGroupsDiffer) {
  ExpectLambMatchesOracle(
      {LambOptions(5e-3).weight_decay(0.1).max_grad_norm(2.0),
       LambOptions(2e-3).betas({0.8, 0.99}).eps(1e-8).weight_decay(0.0).max_grad_norm(2.0)},
      true);
}
// max_grad_norm 0: apex's division by an infinite ratio zeroes every gradient; the moments decay
// and the params shrink by the weight decay's trust-ratio step.
TEST(TorchLionLambParity, LambZeroMaxGradNorm) {
  ExpectLambMatchesOracle(LrScaled(LambOptions(1e-2).max_grad_norm(0.0)), true);
}

}  // namespace
}  // namespace fusedopt::pt::test
