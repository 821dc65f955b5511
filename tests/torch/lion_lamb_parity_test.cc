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
//    max_grad_norm); after the step it compares params (kTolerance), state (kStateTolerance) and
//    step counts, as relative errors floored at 1% of each tensor's largest magnitude (as
//    test_util.h's Compare). Params without a grad must stay bit-identical and get no state.
//
//    Lion's update is ±lr·sign(c), c = β1·m + (1 − β1)·g: where |c| is within rounding of zero
//    next to its terms, f32 and double may take different signs and the param then differs by
//    2·lr. Those elements' params (a handful in a run, counted and bounded) are left out of the
//    comparison; their exp_avg is not.
//
//  - TorchLionLambGolden: the golden trajectories tests/golden/lion.json (lion-pytorch 0.2.5) and
//    tests/golden/lamb.json (tools/lamb_reference.py: apex FusedLAMB's formulas in torch ops, with
//    its global max_grad_norm), every case replayed through the classes for 20 steps and compared
//    after steps 1, 5 and 20 as tests/golden_test.cc compares the core: |a − r| <= 1e-6·max|r| per
//    buffer, and the step counts.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/optim.h"
#include "tests/reference/reference.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

constexpr int kSteps = 20;
constexpr double kTolerance = 2e-6;
// The moments' running sums cancel (m = β·m + (1 − β)·g): an element at the 1% floor carries the
// f32 rounding of terms up to 100x larger.
constexpr double kStateTolerance = 1e-5;
constexpr double kInf = std::numeric_limits<double>::infinity();
// A Lion element whose |c| is below this fraction of |β1·m| + |(1 − β1)·g| may take either sign in
// f32 (its f32 error is below 2e-7 of that sum).
constexpr double kAmbiguousSign = 1e-6;

std::vector<double> Doubles(const torch::Tensor& t) {
  const torch::Tensor d = t.detach().to(torch::kDouble).contiguous();
  const double* data = d.data_ptr<double>();
  return {data, data + d.numel()};
}

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

template <class State>
const State* StateOf(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(p.unsafeGetTensorImpl());
  return it == opt.state().end() ? nullptr : static_cast<const State*>(it->second.get());
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
  EXPECT_LE(param_worst.rel, kTolerance) << "worst param: " << param_worst.where;
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
  EXPECT_LE(param_worst.rel, kTolerance) << "worst param: " << param_worst.where;
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

// ---- Goldens ------------------------------------------------------------------------------------

using nlohmann::json;

// The generator's inputs (tools/make_golden.py; tests/golden_test.cc), bit for bit.
std::uint32_t Mix32(std::uint32_t x) {  // lowbias32
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Step 0: the initial param; step s >= 1: the gradient of global step s.
torch::Tensor MakeTensor(std::uint32_t seed, std::uint32_t tensor, std::uint32_t step,
                         std::size_t n, double scale) {
  torch::Tensor out = torch::empty({static_cast<std::int64_t>(n)}, torch::kFloat);
  float* data = out.data_ptr<float>();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h =
        Mix32(Mix32(Mix32(Mix32(seed) ^ tensor) ^ step) ^ static_cast<std::uint32_t>(i));
    data[i] = static_cast<float>((static_cast<double>(h % 20001u) - 10000.0) / 10000.0 * scale);
  }
  return out;
}

json LoadGolden(const std::string& file) {
  const char* env = std::getenv("FOPT_GOLDEN_DIR");
  const std::filesystem::path dir =
      env != nullptr && *env != '\0' ? std::filesystem::path(env)
                                     : std::filesystem::path(__FILE__).parent_path() / "../golden";
  std::ifstream in(dir / file);
  if (!in) {
    ADD_FAILURE() << "cannot open " << (dir / file).string();
    return json::object();
  }
  return json::parse(in);
}

// lion-pytorch's group dict. Its constructor's decoupled_weight_decay=True divides weight_decay by
// the constructor's lr; LionOptions::weight_decay is the factor of lr, so a user passes wd / lr.
LionOptions ParseOptions(const json& g, const json& c, LionOptions /*tag*/) {
  double weight_decay = g.at("weight_decay").get<double>();
  const json& ctor = c.at("constructor");
  if (ctor.value("decoupled_weight_decay", false)) weight_decay /= ctor.value("lr", 1e-4);
  return LionOptions(g.at("lr").get<double>())
      .betas({g.at("betas").at(0).get<double>(), g.at("betas").at(1).get<double>()})
      .weight_decay(weight_decay);
}

// apex FusedLAMB's group dict; the case's max_grad_norm is the global one.
LambOptions ParseOptions(const json& g, const json& c, LambOptions /*tag*/) {
  return LambOptions(g.at("lr").get<double>())
      .betas({g.at("betas").at(0).get<double>(), g.at("betas").at(1).get<double>()})
      .eps(g.at("eps").get<double>())
      .weight_decay(g.at("weight_decay").get<double>())
      .bias_correction(g.at("bias_correction").get<bool>())
      .adam_w_mode(g.at("adam_w_mode").get<bool>())
      .grad_averaging(g.at("grad_averaging").get<bool>())
      .use_nvlamb(g.at("use_nvlamb").get<bool>())
      .max_grad_norm(c.at("max_grad_norm").get<double>());
}

const torch::Tensor* StateTensor(const LionParamState& s, const std::string& key) {
  return key == "exp_avg" ? &s.exp_avg() : nullptr;
}
const torch::Tensor* StateTensor(const LambParamState& s, const std::string& key) {
  if (key == "exp_avg") return &s.exp_avg();
  if (key == "exp_avg_sq") return &s.exp_avg_sq();
  return nullptr;
}
std::optional<std::int64_t> StateStep(const LionParamState& /*s*/) { return std::nullopt; }
std::optional<std::int64_t> StateStep(const LambParamState& s) { return s.step(); }

// |a − r| <= 1e-6·max|r| over the buffer (tests/golden_test.cc's metric).
void ExpectGoldenClose(const torch::Tensor& actual, const json& ref, const std::string& what) {
  const auto r = ref.get<std::vector<double>>();
  ASSERT_EQ(static_cast<std::size_t>(actual.numel()), r.size()) << what;
  const std::vector<double> a = Doubles(actual);
  double scale = 0.0;
  double worst = 0.0;
  std::size_t at = 0;
  for (const double x : r) scale = std::max(scale, std::abs(x));
  for (std::size_t k = 0; k < r.size(); ++k) {
    const double diff = std::isnan(a[k]) ? kInf : std::abs(a[k] - r[k]);
    if (diff > worst) {
      worst = diff;
      at = k;
    }
  }
  EXPECT_LE(worst, 1e-6 * scale) << what << "[" << at << "]: " << a[at] << " vs golden " << r[at]
                                 << " (max |golden| " << scale << ")";
}

template <class Optimizer, class Options, class State>
void ReplayGoldens(const std::string& file) {
  const json doc = LoadGolden(file);
  ASSERT_TRUE(doc.contains("cases")) << file;
  const int steps = doc.at("steps").get<int>();
  const double param_scale = doc.at("inputs").at("param_scale").get<double>();
  const double grad_scale = doc.at("inputs").at("grad_scale").get<double>();
  int cases = 0;
  for (const json& c : doc.at("cases")) {
    SCOPED_TRACE(file + " case " + c.at("name").get<std::string>());
    ++cases;
    const auto seed = c.at("seed").get<std::uint32_t>();
    const auto sizes = c.at("sizes").get<std::vector<std::size_t>>();
    const auto group_of = c.at("group_of").get<std::vector<std::size_t>>();
    const auto has_grad = c.at("has_grad").get<std::vector<std::vector<bool>>>();
    std::vector<Options> options;
    for (const json& g : c.at("groups")) options.push_back(ParseOptions(g, c, Options{}));

    std::vector<torch::Tensor> params;
    std::vector<std::vector<torch::Tensor>> by_group(options.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      params.push_back(MakeTensor(seed, static_cast<std::uint32_t>(t), 0, sizes[t], param_scale)
                           .requires_grad_(true));
      by_group.at(group_of[t]).push_back(params.back());
    }
    std::vector<torch::optim::OptimizerParamGroup> param_groups;
    for (std::size_t g = 0; g < options.size(); ++g) param_groups.emplace_back(by_group[g]);
    Optimizer opt(param_groups, options[0]);
    // The groups exactly as the reference's dicts (not merged with the defaults).
    for (std::size_t g = 0; g < options.size(); ++g) {
      static_cast<Options&>(opt.param_groups()[g].options()) = options[g];
    }

    std::vector<std::int64_t> count(sizes.size(), 0);
    std::size_t next = 0;
    const json& checkpoints = c.at("checkpoints");
    for (int step = 1; step <= steps; ++step) {
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        if (has_grad.at(step - 1).at(t)) {
          params[t].mutable_grad() =
              MakeTensor(seed, static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(step),
                         sizes[t], grad_scale);
          ++count[t];
        } else {
          params[t].mutable_grad() = torch::Tensor();
        }
      }
      opt.step();
      if (next >= checkpoints.size() || checkpoints[next].at("step").get<int>() != step) continue;
      const json& ck = checkpoints[next++];
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const std::string what =
            "after step " + std::to_string(step) + ", tensor " + std::to_string(t);
        ExpectGoldenClose(params[t], ck.at("params").at(t), what + " param");
        const json& st = ck.at("state").at(t);
        const auto* state = StateOf<State>(opt, params[t]);
        if (count[t] == 0) {
          EXPECT_EQ(state, nullptr) << what << ": state without a step";
          continue;
        }
        ASSERT_NE(state, nullptr) << what;
        for (const auto& [key, value] : st.items()) {
          if (key == "step") {
            EXPECT_EQ(StateStep(*state), value.template get<std::int64_t>()) << what;
            continue;
          }
          const torch::Tensor* tensor = StateTensor(*state, key);
          ASSERT_NE(tensor, nullptr) << what << ": no state " << key;
          ExpectGoldenClose(*tensor, value, what + " " + key);
        }
        if (!st.contains("step")) {
          EXPECT_FALSE(StateStep(*state).has_value()) << what;
        }
      }
    }
    EXPECT_EQ(next, checkpoints.size()) << "checkpoints not reached";
  }
  EXPECT_GE(cases, 5) << file;
}

TEST(TorchLionLambGolden, LionPytorch) {
  ReplayGoldens<Lion, LionOptions, LionParamState>("lion.json");
}
TEST(TorchLionLambGolden, ApexFusedLamb) {
  ReplayGoldens<LAMB, LambOptions, LambParamState>("lamb.json");
}

}  // namespace
}  // namespace fusedopt::pt::test
