// fusedopt::pt's generic classes (FusedOptimizer<Hyper>: every algorithm without a torch::optim
// twin), which libtorch has no twin of (the suite names are the ones ctest runs; Lion's and LAMB's
// numerics against the oracle also in lion_lamb_parity_test.cc, Adafactor's factored states in
// adafactor_test.cc):
//   TorchGenericGolden  typed over the registry's generic classes: tests/golden/<algo>.json
//                       (written by tools/make_golden.py) replayed through each class
//                       (golden_replay.h)
//   TorchGeneric        typed over the classes: torch::save mid-run and torch::load into an
//                       optimizer built with other defaults (options and state, scalar states too,
//                       compare equal and both continue bit for bit); the state keys, dtypes and
//                       shapes; construction and group checks naming the option (a rejected group
//                       is not kept), group options merged with the defaults, another optimizer's
//                       options refused; a param the engine cannot take is an error that changes
//                       nothing; a LossScaler's Inf skip leaves params, states, scalar states and
//                       step counts bit-identical; set_lr as schedulers use it

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/scaler.h"
#include "src/algos/registry.h"
#include "tests/torch/golden_replay.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

// Every algorithm whose class is the generic FusedOptimizer<Hyper> (those without a torch::optim
// twin, Lion and LAMB included), from the registry: the hypers of algos::All whose ClassOf is it.
template <class Kept, class... Hypers>
struct GenericHypers {
  using type = Kept;
};
template <class... Kept, class H, class... Rest>
struct GenericHypers<::testing::Types<Kept...>, H, Rest...>
    : GenericHypers<std::conditional_t<std::is_same_v<typename ClassOf<H>::type, FusedOptimizer<H>>,
                                       ::testing::Types<Kept..., H>, ::testing::Types<Kept...>>,
                    Rest...> {};
template <class Descriptors>
struct GenericOf;
template <class... A>
struct GenericOf<algos::List<A...>> : GenericHypers<::testing::Types<>, typename A::Hyper...> {};

// The reference's class name (tests/golden/<it, lowercase>.json), as the tests' names.
struct ReferenceName {
  template <class Hyper>
  static std::string GetName(int /*index*/) {
    return algos::DescriptorOf<Hyper>::kTorchName;
  }
};

// Each generic class replays its goldens (golden_replay.h): torch.optim 2.13's single-tensor step,
// or the reference tools/make_golden.py runs for the algorithm (lion-pytorch; apex FusedLAMB's
// formulas with its global max_grad_norm; tools/lars_reference.py, tools/rmsproptf_reference.py
// in all 18 modes, clovaai's adamp.AdamP with its matrices projected per row or layer,
// tools/bert_adam_reference.py clipped per (group, dtype), which the class's one step over all
// groups does; torch.optim.Adafactor's matrices, a batch of matrices and vectors).
template <class Hyper>
class TorchGenericGolden : public ::testing::Test {};
TYPED_TEST_SUITE(TorchGenericGolden, GenericOf<algos::All>::type, ReferenceName);

TYPED_TEST(TorchGenericGolden, ReplaysTheReference) {
  using Hyper = TypeParam;
  std::string file = algos::DescriptorOf<Hyper>::kTorchName;
  std::transform(file.begin(), file.end(), file.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  ReplayGoldens<FusedOptimizer<Hyper>, HyperOptions<Hyper>, HyperParamState<Hyper>>(file + ".json");
}

// Options away from the defaults (weight decay on, and each algorithm's own knob).
AdamaxHyper TestHyper(AdamaxHyper h) {
  h.lr = 5e-3;
  h.beta1 = 0.85;
  h.weight_decay = 0.1;
  return h;
}
AdadeltaHyper TestHyper(AdadeltaHyper h) {
  h.lr = 0.5;
  h.rho = 0.8;
  h.weight_decay = 0.1;
  return h;
}
RadamHyper TestHyper(RadamHyper h) {
  h.lr = 5e-3;
  h.weight_decay = 0.1;
  h.decoupled_weight_decay = true;
  return h;
}
NadamHyper TestHyper(NadamHyper h) {
  h.lr = 5e-3;
  h.weight_decay = 0.1;
  h.momentum_decay = 5e-3;
  return h;
}
// Every state (momentum, centered); the decay coupled, so that lr 0 leaves a param as it is.
RmsproptfHyper TestHyper(RmsproptfHyper h) {
  h.lr = 5e-3;
  h.weight_decay = 0.1;
  h.momentum = 0.9;
  h.centered = true;
  return h;
}
RpropHyper TestHyper(RpropHyper h) {  // Rprop has no weight decay
  h.lr = 5e-2;
  h.etaminus = 0.4;
  h.etaplus = 1.3;
  return h;
}
LarsHyper TestHyper(LarsHyper h) {
  h.lr = 5e-2;
  h.momentum = 0.9;
  h.weight_decay = 0.1;
  return h;
}
AdampHyper TestHyper(AdampHyper h) {
  h.lr = 5e-3;
  h.weight_decay = 0.1;
  h.nesterov = true;
  return h;
}
// A schedule that reads the step (linear decay over 50 steps, no warmup: the first step moves the
// params) and clipping that fires.
BertAdamHyper TestHyper(BertAdamHyper h) {
  h.lr = 5e-3;
  h.t_total = 50;
  h.weight_decay = 0.1;
  h.max_grad_norm = 0.5;
  return h;
}
// Every option away from its default; eps1 that of bfloat16 (torch's None for the bf16 params of
// StateKeys).
AdafactorHyper TestHyper(AdafactorHyper h) {
  h.lr = 5e-2;
  h.beta2_decay = -0.6;
  h.eps1 = 7.8125e-3;
  h.eps2 = 2e-3;
  h.d = 1.5;
  h.weight_decay = 0.1;
  return h;
}
AsgdHyper TestHyper(AsgdHyper h) {
  h.lr = 5e-2;
  h.weight_decay = 0.1;
  h.t0 = 2;  // averaging from the third step on
  return h;
}

// torch's state keys of each (tensors, then 0-d f32 scalar states).
std::vector<std::string> TensorKeys(AdamaxHyper /*tag*/) { return {"exp_avg", "exp_inf"}; }
std::vector<std::string> TensorKeys(AdadeltaHyper /*tag*/) { return {"square_avg", "acc_delta"}; }
std::vector<std::string> TensorKeys(RadamHyper /*tag*/) { return {"exp_avg", "exp_avg_sq"}; }
std::vector<std::string> TensorKeys(NadamHyper /*tag*/) { return {"exp_avg", "exp_avg_sq"}; }
std::vector<std::string> TensorKeys(AsgdHyper /*tag*/) { return {"ax"}; }
std::vector<std::string> TensorKeys(LarsHyper /*tag*/) { return {"momentum_buffer"}; }
std::vector<std::string> TensorKeys(AdampHyper /*tag*/) { return {"exp_avg", "exp_avg_sq"}; }
std::vector<std::string> TensorKeys(RpropHyper /*tag*/) { return {"prev", "step_size"}; }
std::vector<std::string> TensorKeys(BertAdamHyper /*tag*/) { return {"exp_avg", "exp_avg_sq"}; }
std::vector<std::string> TensorKeys(RmsproptfHyper /*tag*/) {
  return {"square_avg", "momentum_buffer", "grad_avg"};
}
std::vector<std::string> TensorKeys(AdafactorHyper /*tag*/) { return {"row_var", "col_var"}; }
std::vector<std::string> ScalarKeys(AdamaxHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(AdafactorHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(AdadeltaHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(RadamHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(NadamHyper /*tag*/) { return {"mu_product"}; }
std::vector<std::string> ScalarKeys(AsgdHyper /*tag*/) { return {"eta", "mu"}; }
std::vector<std::string> ScalarKeys(LarsHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(AdampHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(RpropHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(RmsproptfHyper /*tag*/) { return {}; }
std::vector<std::string> ScalarKeys(BertAdamHyper /*tag*/) { return {}; }

template <class Optimizer>
class TorchGeneric : public ::testing::Test {};
using Optimizers = ::testing::Types<Adamax, Adadelta, Adafactor, RAdam, NAdam, ASGD, Rprop, LARS,
                                    RMSpropTF, AdamP, BertAdam>;
TYPED_TEST_SUITE(TorchGeneric, Optimizers);

template <class Optimizer>
using HyperOf = std::remove_cvref_t<decltype(std::declval<typename Optimizer::Options>().hyper())>;

// The test model (test_util.h). Adafactor refuses a param of no elements, as torch's step does (it
// divides by numel), so for it a batch of matrices [2, 3, 4] takes the empty param's place
// (params[1][1]): the typed tests then also cover a factored batch.
template <class Optimizer>
Params ParamsFor(std::uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  Params params = MakeParams(seed, dtype);
  if constexpr (std::is_same_v<Optimizer, Adafactor>) {
    torch::manual_seed(seed + 1000);
    params[1][1] = torch::randn({2, 3, 4}).to(dtype).requires_grad_(true);
  }
  return params;
}

// The shape of state `key` of p: p's own, but Adafactor's factors (torch's row_var [..., R, 1] and
// col_var [..., 1, C]).
template <class Optimizer>
std::vector<std::int64_t> StateShape(const torch::Tensor& p, const std::string& key) {
  std::vector<std::int64_t> shape(p.sizes().begin(), p.sizes().end());
  if constexpr (std::is_same_v<Optimizer, Adafactor>) {
    if (key == "row_var") shape.back() = 1;
    if (key == "col_var") shape[shape.size() - 2] = 1;
  }
  return shape;
}

template <class Optimizer>
Optimizer MakeOptimizer(const Params& params, const HyperOf<Optimizer>& hyper) {
  using Options = typename Optimizer::Options;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  HyperOf<Optimizer> second = hyper;
  second.lr = hyper.lr / 2;  // group 1 with its own lr
  groups.emplace_back(params[0]);
  groups.emplace_back(params[1], std::make_unique<Options>(second));
  return Optimizer(groups, Options(hyper));
}

// Deep copies of every state (null where a param has none), in param order.
template <class Optimizer>
std::vector<std::unique_ptr<typename Optimizer::ParamState>> Snapshot(const Optimizer& opt,
                                                                      const Params& params) {
  using State = typename Optimizer::ParamState;
  std::vector<std::unique_ptr<State>> out;
  for (const auto& group : params) {
    for (const auto& p : group) {
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) {
        out.push_back(nullptr);
        continue;
      }
      const auto& s = static_cast<const State&>(*it->second);
      auto copy = std::make_unique<State>();
      copy->step(s.step());
      for (int k = 0; k < kMaxStates; ++k) {
        if (s.tensors[k].defined()) copy->tensors[k] = s.tensors[k].clone();
      }
      for (int k = 0; k < kMaxScalars; ++k) {
        if (s.scalars[k].defined()) copy->scalars[k] = s.scalars[k].clone();
      }
      out.push_back(std::move(copy));
    }
  }
  return out;
}

TYPED_TEST(TorchGeneric, SaveLoadContinuesBitForBit) {
  using Optimizer = TypeParam;
  using Options = typename Optimizer::Options;
  const auto hyper = TestHyper(HyperOf<Optimizer>{});
  Params params = ParamsFor<Optimizer>(41);
  Optimizer original = MakeOptimizer<Optimizer>(params, hyper);
  for (int t = 0; t < 5; ++t) {
    SetGrads(params, t);
    original.step();
  }
  Params loaded_params = CloneParams(params);
  HyperOf<Optimizer> other;
  other.lr = 0.25;
  Optimizer loaded = MakeOptimizer<Optimizer>(loaded_params, other);
  std::stringstream buffer;
  torch::save(original, buffer);
  torch::load(loaded, buffer);

  for (std::size_t g = 0; g < 2; ++g) {
    EXPECT_TRUE(static_cast<const Options&>(loaded.param_groups()[g].options()) ==
                static_cast<const Options&>(original.param_groups()[g].options()))
        << "param_groups[" << g << "]";
  }
  EXPECT_TRUE(SameStates(Snapshot(loaded, loaded_params), Snapshot(original, params)));
  for (int t = 5; t < 10; ++t) {
    SetGrads(params, t);
    SetGrads(loaded_params, t);
    original.step();
    loaded.step();
  }
  EXPECT_TRUE(BitwiseEqual(loaded_params, params))
      << "max rel diff " << MaxRelDiff(loaded_params, params);
  EXPECT_TRUE(SameStates(Snapshot(loaded, loaded_params), Snapshot(original, params)));
}

// The state under torch's keys: tensors in the param's dtype and shape (Adafactor's factors of a
// [33, 5] param: [33, 1] and [1, 5]), scalar states 0-d f32
// (NAdam's mu_product: 1 times a μ_1 in (0, β1); ASGD's eta and mu after one step: lr / (1 +
// λ·lr)^α and 1, as torch).
TYPED_TEST(TorchGeneric, StateKeys) {
  using Optimizer = TypeParam;
  using Hyper = HyperOf<Optimizer>;
  Params params = ParamsFor<Optimizer>(42, torch::kBFloat16);
  const Hyper hyper = TestHyper(Hyper{});
  Optimizer opt = MakeOptimizer<Optimizer>(params, hyper);
  SetGrads(params, 0);
  opt.step();
  const torch::Tensor& p = params[0][1];
  ASSERT_TRUE(p.grad().defined());
  auto& state =
      static_cast<typename Optimizer::ParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  EXPECT_EQ(state.step(), 1);
  for (const std::string& key : TensorKeys(Hyper{})) {
    EXPECT_EQ(state.state(key).scalar_type(), torch::kBFloat16) << key;
    EXPECT_EQ(state.state(key).sizes(), torch::IntArrayRef(StateShape<Optimizer>(p, key))) << key;
  }
  for (const std::string& key : ScalarKeys(Hyper{})) {
    EXPECT_EQ(state.state(key).dim(), 0) << key;
    EXPECT_EQ(state.state(key).scalar_type(), torch::kFloat) << key;
  }
  if constexpr (std::is_same_v<Optimizer, NAdam>) {
    const torch::Tensor& mu = state.state("mu_product");
    const float mu_product = mu.item<float>();
    EXPECT_GT(mu_product, 0.0f);
    EXPECT_LT(mu_product, hyper.beta1);
  }
  if constexpr (std::is_same_v<Optimizer, ASGD>) {
    const double eta = hyper.lr / std::pow(1.0 + hyper.lambd * hyper.lr, hyper.alpha);
    const torch::Tensor& eta_state = state.state("eta");
    const torch::Tensor& mu_state = state.state("mu");
    EXPECT_NEAR(eta_state.item<float>(), eta, 1e-6 * eta);
    EXPECT_EQ(mu_state.item<float>(), 1.0f);
  }
  ExpectTorchError([&] { state.state("max_exp_avg_sq"); }, {"has no state 'max_exp_avg_sq'"});
}

TYPED_TEST(TorchGeneric, OptionChecks) {
  using Optimizer = TypeParam;
  using Options = typename Optimizer::Options;
  Params params = ParamsFor<Optimizer>(43);
  HyperOf<Optimizer> bad;
  bad.lr = -1.0;
  ExpectTorchError([&] { Optimizer opt(params[0], Options(bad)); }, {"invalid lr: -1"});
  // Rprop has no weight decay; BertAdam's reference ignores a negative one (`if weight_decay > 0`).
  if constexpr (requires { bad.weight_decay; } &&
                !std::is_same_v<HyperOf<Optimizer>, BertAdamHyper>) {
    bad = {};
    bad.weight_decay = -0.5;
    ExpectTorchError([&] { Optimizer opt(params[0], Options(bad)); },
                     {"invalid weight_decay: -0.5"});
  }

  // A group's own option is checked as it is added; the rejected group is not kept.
  Optimizer opt(params[0], Options(HyperOf<Optimizer>{}));
  HyperOf<Optimizer> group;
  group.lr = -1e-3;
  ExpectTorchError(
      [&] {
        opt.add_param_group(
            torch::optim::OptimizerParamGroup(params[1], std::make_unique<Options>(group)));
      },
      {"group 1", "invalid lr"});
  EXPECT_EQ(opt.param_groups().size(), 1u);

  // libtorch's merge: the fields a group sets away from their defaults, the others the defaults'.
  HyperOf<Optimizer> defaults = TestHyper(HyperOf<Optimizer>{});
  Optimizer merged(params[0], Options(defaults));
  HyperOf<Optimizer> own;
  own.lr = 0.125;
  merged.add_param_group(
      torch::optim::OptimizerParamGroup(params[1], std::make_unique<Options>(own)));
  const auto& got = static_cast<const Options&>(merged.param_groups()[1].options()).hyper();
  EXPECT_EQ(got.lr, 0.125);
  if constexpr (requires { got.weight_decay; }) {
    EXPECT_EQ(got.weight_decay, defaults.weight_decay);
  } else {
    EXPECT_EQ(got.etaminus, defaults.etaminus);
  }

  // Another optimizer's options are refused.
  ExpectTorchError(
      [&] {
        merged.add_param_group(torch::optim::OptimizerParamGroup(
            params[1], std::make_unique<torch::optim::AdamOptions>(1e-3)));
      },
      {"Options"});
}

// No torch::optim twin takes what the engine cannot: a float64 param is an error before anything
// changes (the other params keep their values and get no state).
TYPED_TEST(TorchGeneric, RefusedParamChangesNothing) {
  using Optimizer = TypeParam;
  Params params = ParamsFor<Optimizer>(44);
  params[1][2] = params[1][2].detach().to(torch::kDouble).requires_grad_(true);
  Optimizer opt = MakeOptimizer<Optimizer>(params, TestHyper(HyperOf<Optimizer>{}));
  SetGrads(params, 0);
  const Params before = CloneParams(params);
  ExpectTorchError([&] { opt.step(); }, {"param_groups[1].params[2]", "Double"});
  EXPECT_TRUE(BitwiseEqual(params, before));
  EXPECT_TRUE(opt.state().empty());
}

// An Inf gradient under a LossScaler skips the step: params, states (NAdam's mu_product too) and
// step counts stay bit-identical and the scale halves; the next good step runs as a plain
// optimizer's does on the unscaled gradients.
TYPED_TEST(TorchGeneric, ScalerSkipChangesNothing) {
  using Optimizer = TypeParam;
  const auto hyper = TestHyper(HyperOf<Optimizer>{});
  Params a = ParamsFor<Optimizer>(45);
  Params b = CloneParams(a);
  Optimizer fa = MakeOptimizer<Optimizer>(a, hyper);
  Optimizer fb = MakeOptimizer<Optimizer>(b, hyper);
  LossScaler scaler({.init_scale = 256.0f});
  fa.training().scaler = &scaler;
  for (int t = 0; t < 4; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    SetGrads(a, t);
    SetGrads(b, t);
    const float scale = scaler.scale();
    for (const auto& group : a) {
      for (const auto& p : group) {
        if (p.grad().defined()) p.mutable_grad().mul_(scale);
      }
    }
    const bool inject = t == 2;
    if (inject) a[0][0].grad()[3] = std::numeric_limits<float>::infinity();  // has a grad at t = 2
    const Params before = CloneParams(a);
    const auto states_before = Snapshot(fa, a);
    fa.step();
    EXPECT_EQ(fa.last_step().stepped, !inject);
    if (inject) {
      EXPECT_TRUE(BitwiseEqual(a, before));
      EXPECT_TRUE(SameStates(Snapshot(fa, a), states_before));
      EXPECT_EQ(scaler.scale(), scale / 2);
    } else {
      fb.step();
    }
    EXPECT_TRUE(BitwiseEqual(a, b)) << "max rel diff " << MaxRelDiff(a, b);
    EXPECT_TRUE(SameStates(Snapshot(fa, a), Snapshot(fb, b)));
  }
}

// get_lr / set_lr, which libtorch's schedulers use, read and write the group's lr.
TYPED_TEST(TorchGeneric, SetLr) {
  using Optimizer = TypeParam;
  Params params = ParamsFor<Optimizer>(46);
  Optimizer opt = MakeOptimizer<Optimizer>(params, TestHyper(HyperOf<Optimizer>{}));
  auto& options = opt.param_groups()[1].options();
  options.set_lr(0.0);
  EXPECT_EQ(options.get_lr(), 0.0);
  SetGrads(params, 0);
  const Params before = CloneParams(params);
  opt.step();
  // lr 0 in group 1 leaves its params as they were (weight decay is scaled by lr too); both params
  // compared have a grad at t = 0.
  ASSERT_TRUE(params[1][2].grad().defined() && params[0][0].grad().defined());
  if constexpr (std::is_same_v<Optimizer, Rprop>) {
    // Rprop's lr is only the first step size, which the clamp raises to step_size_min, as torch's.
    const double moved = (params[1][2] - before[1][2]).abs().max().template item<double>();
    EXPECT_GT(moved, 0.0);
    EXPECT_LE(moved, RpropHyper{}.step_size_min + 5e-7);  // + f32 rounding at |p| < 8
  } else {
    EXPECT_TRUE(torch::equal(params[1][2], before[1][2]));
  }
  EXPECT_FALSE(torch::equal(params[0][0], before[0][0]));
}

}  // namespace
}  // namespace fusedopt::pt::test
