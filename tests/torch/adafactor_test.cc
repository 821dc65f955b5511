// fusedopt::pt::Adafactor (FusedOptimizer<AdafactorHyper>), whose state is not shaped like the
// params: for a param of more than one dimension row_var [..., R, 1] and col_var [..., 1, C], for
// the others variance. The suite TorchAdafactor checks what the typed TorchGeneric suite and the
// golden replay (generic_test.cc) do not:
//   - steps against torch.optim.Adafactor's _single_tensor_adafactor written here with torch ops
//     in double (matrices, a batch of matrices, [.., 1, 1] convolution-style weights, a matrix of
//     several tiles, vectors, a 0-d param), params and factors, shapes and dtypes of every state;
//   - torch::save / torch::load keep the factors' shapes and continue bit for bit;
//   - a loaded factor of another shape (or another element count) is refused naming param and key,
//     with params, states and step counts unchanged;
//   - a param of no elements is refused as torch's step refuses it (ZeroDivisionError), changing
//     nothing;
//   - training().max_grad_norm equals fusedopt::pt::ClipGradNorm and a plain step, bit for bit.

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/training.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

using State = Adafactor::ParamState;

// Matrices (one of several of the core's tiles: 70·600 > 32768 elements), a batch of matrices,
// a batch of 1×1 matrices (a [out, in, 1, 1] convolution weight), vectors and a 0-d param.
std::vector<std::vector<std::int64_t>> Shapes() {
  return {{6, 11}, {2, 3, 4}, {4, 3, 1, 1}, {70, 600}, {33}, {1}, {}};
}

std::vector<torch::Tensor> MakeModel(std::uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (const auto& shape : Shapes()) {
    params.push_back(torch::randn(shape).to(dtype).requires_grad_(true));
  }
  return params;
}

std::vector<torch::Tensor> Clone(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// The gradients of step t, the same for every model (drawn from t and the param's index).
void SetGrads(const std::vector<torch::Tensor>& params, int t) {
  for (std::size_t k = 0; k < params.size(); ++k) {
    torch::manual_seed(static_cast<std::uint64_t>(500 * static_cast<std::size_t>(t) + k));
    params[k].mutable_grad() =
        (torch::randn(params[k].sizes()) * (0.5 + k % 3)).to(params[k].scalar_type());
  }
}

bool Bitwise(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (!torch::equal(a[k].detach(), b[k].detach())) return false;
  }
  return true;
}

State& StateOf(Adafactor& opt, const torch::Tensor& p) {
  return static_cast<State&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

// The shapes torch.optim.Adafactor's _init_group gives the factors.
std::vector<std::int64_t> RowShape(const torch::Tensor& p) {
  std::vector<std::int64_t> s(p.sizes().begin(), p.sizes().end());
  s.back() = 1;
  return s;
}
std::vector<std::int64_t> ColShape(const torch::Tensor& p) {
  std::vector<std::int64_t> s(p.sizes().begin(), p.sizes().end());
  s[s.size() - 2] = 1;
  return s;
}

// torch 2.13's _single_tensor_adafactor, line by line, in double (p is a float64 copy).
struct RefState {
  torch::Tensor row_var, col_var, variance;
  std::int64_t step = 0;
};
void ReferenceStep(torch::Tensor& p, const torch::Tensor& grad_in, RefState& s,
                   const AdafactorHyper& h) {
  const torch::Tensor grad = h.maximize ? -grad_in : grad_in;
  const auto t = static_cast<double>(++s.step);
  const double one_minus_beta2_t = std::pow(t, h.beta2_decay);
  const double rho_t = std::min(h.lr, 1.0 / std::sqrt(t));
  const double alpha =
      std::max(h.eps2, p.norm().item<double>() / std::sqrt(static_cast<double>(p.numel()))) * rho_t;
  if (h.weight_decay != 0.0) p.mul_(1.0 - h.lr * h.weight_decay);
  torch::Tensor var_estimate;
  if (grad.dim() > 1) {
    if (!s.row_var.defined()) {
      s.row_var = torch::zeros(RowShape(grad), grad.options());
      s.col_var = torch::zeros(ColShape(grad), grad.options());
    }
    s.row_var.lerp_((grad * grad).mean(-1, true), one_minus_beta2_t);
    s.col_var.lerp_((grad * grad).mean(-2, true), one_minus_beta2_t);
    var_estimate = torch::matmul(s.row_var, s.col_var) / s.row_var.mean(-2, true).clamp_min(h.eps1);
  } else {
    if (!s.variance.defined()) s.variance = torch::zeros_like(grad);
    s.variance.lerp_(grad * grad, one_minus_beta2_t);
    var_estimate = s.variance.clone();
  }
  const torch::Tensor update = var_estimate.clamp_min(h.eps1 * h.eps1).rsqrt() * grad;
  const double denom = std::max(
      1.0, update.norm().item<double>() / (std::sqrt(static_cast<double>(update.numel())) * h.d));
  p.add_(update, -alpha / denom);
}

// max|a − r| <= tolerance·max|r| (r non-zero).
void ExpectNear(const torch::Tensor& actual, const torch::Tensor& reference,
                const std::string& what, double tolerance) {
  ASSERT_EQ(actual.sizes(), reference.sizes()) << what;
  const torch::Tensor a = actual.detach().to(torch::kDouble);
  const double scale = reference.abs().max().item<double>();
  const double diff = (a - reference).abs().max().item<double>();
  EXPECT_LE(diff, tolerance * scale)
      << what << ": max |difference| " << diff << ", max |reference| " << scale;
}

void ExpectMatchesReference(const AdafactorHyper& hyper) {
  std::vector<torch::Tensor> params = MakeModel(7);
  std::vector<torch::Tensor> ref;
  ref.reserve(params.size());
  for (const auto& p : params) ref.push_back(p.detach().to(torch::kDouble));
  std::vector<RefState> ref_states(params.size());
  Adafactor opt(params, AdafactorOptions(hyper));
  for (int t = 0; t < 8; ++t) {
    SCOPED_TRACE("step " + std::to_string(t + 1));
    SetGrads(params, t);
    opt.step();
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::string what = "param " + std::to_string(k);
      ReferenceStep(ref[k], params[k].grad().to(torch::kDouble), ref_states[k], hyper);
      ExpectNear(params[k], ref[k], what, 1e-5);
      State& s = StateOf(opt, params[k]);
      EXPECT_EQ(s.step(), t + 1) << what;
      if (params[k].dim() > 1) {
        EXPECT_FALSE(s.state("variance").defined()) << what;
        ExpectNear(s.state("row_var"), ref_states[k].row_var, what + " row_var", 1e-5);
        ExpectNear(s.state("col_var"), ref_states[k].col_var, what + " col_var", 1e-5);
      } else {
        EXPECT_FALSE(s.state("row_var").defined()) << what;
        EXPECT_FALSE(s.state("col_var").defined()) << what;
        ExpectNear(s.state("variance"), ref_states[k].variance, what + " variance", 1e-5);
      }
    }
  }
}

TEST(TorchAdafactor, MatchesTorchStepDefaults) { ExpectMatchesReference(AdafactorHyper{}); }

TEST(TorchAdafactor, MatchesTorchStepOptions) {
  ExpectMatchesReference({.lr = 0.05,
                          .beta2_decay = -0.6,
                          .eps1 = 1e-3,
                          .eps2 = 1e-2,
                          .d = 1.5,
                          .weight_decay = 0.1,
                          .maximize = true});
}

// The states as torch keeps them: a factored param's row_var and col_var of torch's shapes, a
// vector's (and a 0-d param's) variance of its own, in the param's dtype; step counts.
TEST(TorchAdafactor, StateShapesAndDtypes) {
  std::vector<torch::Tensor> params = MakeModel(8, torch::kBFloat16);
  Adafactor opt(params, AdafactorOptions(AdafactorHyper{.eps1 = 7.8125e-3}));
  SetGrads(params, 0);
  opt.step();
  SetGrads(params, 1);
  opt.step();
  for (const auto& p : params) {
    SCOPED_TRACE("shape " + c10::str(p.sizes()));
    State& s = StateOf(opt, p);
    EXPECT_EQ(s.step(), 2);
    if (p.dim() > 1) {
      EXPECT_EQ(s.state("row_var").sizes(), torch::IntArrayRef(RowShape(p)));
      EXPECT_EQ(s.state("col_var").sizes(), torch::IntArrayRef(ColShape(p)));
      EXPECT_EQ(s.state("row_var").scalar_type(), torch::kBFloat16);
      EXPECT_EQ(s.state("col_var").scalar_type(), torch::kBFloat16);
      EXPECT_FALSE(s.state("variance").defined());
    } else {
      EXPECT_EQ(s.state("variance").sizes(), p.sizes());
      EXPECT_EQ(s.state("variance").scalar_type(), torch::kBFloat16);
      EXPECT_FALSE(s.state("row_var").defined());
      EXPECT_FALSE(s.state("col_var").defined());
    }
  }
}

// torch::save mid-run and torch::load into an optimizer built with other defaults: the factors
// keep their shapes, options and states compare equal, and both continue bit for bit.
TEST(TorchAdafactor, SaveLoadKeepsFactorShapes) {
  const AdafactorHyper hyper{.lr = 0.03, .weight_decay = 0.05};
  std::vector<torch::Tensor> a = MakeModel(9);
  Adafactor original(a, AdafactorOptions(hyper));
  for (int t = 0; t < 3; ++t) {
    SetGrads(a, t);
    original.step();
  }
  std::vector<torch::Tensor> b = Clone(a);
  Adafactor loaded(b, AdafactorOptions(0.5));
  std::stringstream buffer;
  torch::save(original, buffer);
  torch::load(loaded, buffer);
  EXPECT_TRUE(static_cast<const AdafactorOptions&>(loaded.param_groups()[0].options()) ==
              static_cast<const AdafactorOptions&>(original.param_groups()[0].options()));
  for (std::size_t k = 0; k < a.size(); ++k) {
    SCOPED_TRACE("param " + std::to_string(k));
    State& sa = StateOf(original, a[k]);
    State& sb = StateOf(loaded, b[k]);
    EXPECT_TRUE(sa == sb);
    for (const char* key : {"row_var", "col_var", "variance"}) {
      EXPECT_EQ(sa.state(key).defined(), sb.state(key).defined()) << key;
      if (sa.state(key).defined()) {
        EXPECT_EQ(sa.state(key).sizes(), sb.state(key).sizes()) << key;
      }
    }
  }
  for (int t = 3; t < 6; ++t) {
    SetGrads(a, t);
    SetGrads(b, t);
    original.step();
    loaded.step();
  }
  EXPECT_TRUE(Bitwise(a, b));
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(StateOf(original, a[k]) == StateOf(loaded, b[k])) << "param " << k;
  }
}

// A loaded factor of another shape (the same element count transposed, or another count) is an
// error naming param and key; params, states and step counts stay as they were.
TEST(TorchAdafactor, LoadedFactorOfAnotherShapeRefused) {
  std::vector<torch::Tensor> params = MakeModel(10);
  Adafactor opt(params, AdafactorOptions(AdafactorHyper{}));
  SetGrads(params, 0);
  opt.step();
  struct Case {
    std::size_t param;
    const char* key;
    std::vector<std::int64_t> shape;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {0, "row_var", {1, 6}, "has shape [1, 6] but the param's shape [6, 11] needs [6, 1]"},
      {1,
       "col_var",
       {2, 1, 3},
       "has shape [2, 1, 3] but the param's shape [2, 3, 4] needs [2, 1, 4]"},
      {2, "row_var", {12}, "has shape [12] but the param's shape [4, 3, 1, 1] needs [4, 3, 1, 1]"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    torch::Tensor& slot = StateOf(opt, params[c.param]).state(c.key);
    const torch::Tensor good = slot;
    const torch::Tensor bad = torch::zeros(c.shape);
    slot = bad;
    SetGrads(params, 1);
    const std::vector<torch::Tensor> before = Clone(params);
    std::vector<torch::Tensor> states_before;
    std::vector<std::int64_t> steps_before;
    for (const auto& p : params) {
      State& s = StateOf(opt, p);
      steps_before.push_back(s.step());
      for (const char* key : {"row_var", "col_var", "variance"}) {
        if (s.state(key).defined()) states_before.push_back(s.state(key).clone());
      }
    }
    ExpectTorchError([&] { opt.step(); },
                     {"fusedopt::pt::Adafactor", "state '" + std::string(c.key) + "'",
                      "param_groups[0].params[" + std::to_string(c.param) + "]", c.expect});
    EXPECT_TRUE(Bitwise(params, before));
    std::size_t k = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      State& s = StateOf(opt, params[i]);
      EXPECT_EQ(s.step(), steps_before[i]);
      for (const char* key : {"row_var", "col_var", "variance"}) {
        if (!s.state(key).defined()) continue;
        EXPECT_TRUE(torch::equal(s.state(key), states_before.at(k++))) << i << " " << key;
      }
    }
    EXPECT_TRUE(slot.is_same(bad));  // the rejected tensor is neither replaced nor converted
    slot = good;
  }
  opt.step();  // with the factors restored, the step runs
  EXPECT_EQ(StateOf(opt, params[0]).step(), 2);
}

// torch.optim.Adafactor's step divides by a param's numel (ZeroDivisionError for an empty one):
// an error here, before anything changes.
TEST(TorchAdafactor, EmptyParamRefused) {
  std::vector<torch::Tensor> params = MakeModel(11);
  params.push_back(torch::zeros({3, 0}).requires_grad_(true));
  Adafactor opt(params, AdafactorOptions(AdafactorHyper{}));
  SetGrads(params, 0);
  const std::vector<torch::Tensor> before = Clone(params);
  ExpectTorchError([&] { opt.step(); }, {"param_groups[0].params[7]", "has no elements", "[3, 0]"});
  EXPECT_TRUE(Bitwise(params, before));
  EXPECT_TRUE(opt.state().empty());
}

// training().max_grad_norm: the same as fusedopt::pt::ClipGradNorm and a plain step, bit for bit
// (the clip factor scales the gradient as it is read, by the same f32 multiply).
TEST(TorchAdafactor, ClipInStep) {
  const AdafactorHyper hyper{.lr = 0.05, .weight_decay = 0.1};
  std::vector<torch::Tensor> a = MakeModel(12);
  std::vector<torch::Tensor> b = Clone(a);
  Adafactor fa(a, AdafactorOptions(hyper));
  Adafactor fb(b, AdafactorOptions(hyper));
  fa.training().max_grad_norm = 1.0;
  for (int t = 0; t < 5; ++t) {
    SetGrads(a, t);
    SetGrads(b, t);
    fa.step();
    const double norm = ClipGradNorm(b, 1.0);
    fb.step();
    ASSERT_TRUE(fa.last_step().grad_norm.has_value());
    EXPECT_EQ(*fa.last_step().grad_norm, norm);
    EXPECT_LT(fa.last_step().clip_coef, 1.0f);
    EXPECT_TRUE(Bitwise(a, b)) << "step " << t;
  }
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(StateOf(fa, a[k]) == StateOf(fb, b[k])) << "param " << k;
  }
}

}  // namespace
}  // namespace fusedopt::pt::test
