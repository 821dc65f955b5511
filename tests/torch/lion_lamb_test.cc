// fusedopt::pt::Lion and fusedopt::pt::LAMB as libtorch optimizers (their numerics against the
// references: lion_lamb_parity_test.cc):
//   TorchLionLambSerialize  torch::save mid-run, torch::load into an optimizer built with other
//                           defaults: options and state compare equal, and both continue bit for
//                           bit like the uninterrupted run (TorchLionLambSerializeOptions: every
//                           LAMB option survives the archive; archives in the layout of Lion's and
//                           LAMB's former classes, and of the generic ones' field names, load)
//   TorchLionLambErrors     construction checks naming the option, group options (kept, merged
//                           with the defaults, of the wrong type), a param given twice, LAMB's
//                           clipping rules, invalid live options: c10::Error, and nothing changed
//   TorchLionLambTraining   a LossScaler: an Inf/NaN gradient skips the step with params, state
//                           and step counts bit-identical, and the run equals a plain one that
//                           takes only the good steps; Lion with training().max_grad_norm

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/training.h"
#include "fusedopt/scaler.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

// Options with weight decay (LAMB: clipping too) and betas away from the defaults.
LionOptions TestOptions(const LionOptions& /*tag*/) {
  return LionOptions(1e-3).weight_decay(0.1).betas({0.95, 0.98});
}
LambOptions TestOptions(const LambOptions& /*tag*/) {
  return LambOptions(1e-2).weight_decay(0.05).max_grad_norm(2.0).betas({0.85, 0.99});
}

template <class OptimizerT, class OptionsT, class StateT>
struct Algo {
  using Optimizer = OptimizerT;
  using Options = OptionsT;
  using State = StateT;
};
using LionAlgo = Algo<Lion, LionOptions, LionParamState>;
using LambAlgo = Algo<LAMB, LambOptions, LambParamState>;

std::vector<torch::Tensor> Flat(const Params& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& group : params) flat.insert(flat.end(), group.begin(), group.end());
  return flat;
}

// A deep copy of a state (a copy of the State object would share its tensors' storage).
LionParamState Snapshot(const LionParamState& s) {
  LionParamState out;
  if (s.exp_avg().defined()) out.exp_avg(s.exp_avg().clone());
  return out;
}
LambParamState Snapshot(const LambParamState& s) {
  LambParamState out;
  out.step(s.step());
  if (s.exp_avg().defined()) out.exp_avg(s.exp_avg().clone());
  if (s.exp_avg_sq().defined()) out.exp_avg_sq(s.exp_avg_sq().clone());
  return out;
}

// Deep copies of every state (null where a param has none), in param order.
template <class State>
std::vector<std::unique_ptr<State>> SnapshotStates(const torch::optim::Optimizer& opt,
                                                   const Params& params) {
  std::vector<std::unique_ptr<State>> states;
  for (const auto& p : Flat(params)) {
    auto it = opt.state().find(p.unsafeGetTensorImpl());
    states.push_back(it == opt.state().end() ? nullptr
                                             : std::make_unique<State>(Snapshot(
                                                   static_cast<const State&>(*it->second))));
  }
  return states;
}

template <class A>
class TorchLionLambSerialize : public ::testing::Test {};
using Algos = ::testing::Types<LionAlgo, LambAlgo>;
TYPED_TEST_SUITE(TorchLionLambSerialize, Algos);

template <class Saved, class Loaded>
void SaveLoad(const Saved& from, Loaded& to) {
  std::stringstream buffer;
  torch::save(from, buffer);
  torch::load(to, buffer);
}

// Saved after 5 steps and loaded into an optimizer built with other defaults: the groups' options
// and every state come back equal, and the loaded one continues bit for bit like the original.
TYPED_TEST(TorchLionLambSerialize, SaveLoadContinuesBitForBit) {
  using Optimizer = typename TypeParam::Optimizer;
  using Options = typename TypeParam::Options;
  using State = typename TypeParam::State;
  const Options options = TestOptions(Options{});

  Params params = MakeParams(31);
  Optimizer original(MakeGroups(params, options), options);
  for (int t = 0; t < 5; ++t) {
    SetGrads(params, t);
    original.step();
  }
  Params loaded_params = CloneParams(params);
  const Options other = Options(0.5).weight_decay(0.0);
  Optimizer loaded(MakeGroups(loaded_params, other, 1.0), other);
  SaveLoad(original, loaded);

  ASSERT_EQ(loaded.param_groups().size(), original.param_groups().size());
  for (std::size_t g = 0; g < original.param_groups().size(); ++g) {
    EXPECT_TRUE(static_cast<const Options&>(loaded.param_groups()[g].options()) ==
                static_cast<const Options&>(original.param_groups()[g].options()))
        << "param_groups[" << g << "] options";
  }
  EXPECT_FALSE(static_cast<const Options&>(loaded.param_groups()[0].options()) == other);
  ASSERT_EQ(loaded.state().size(), original.state().size());
  EXPECT_TRUE(SameStates(SnapshotStates<State>(loaded, loaded_params),
                         SnapshotStates<State>(original, params)));

  StepBothAlike(original, params, loaded, loaded_params, 5, 10);
  EXPECT_TRUE(SameStates(SnapshotStates<State>(loaded, loaded_params),
                         SnapshotStates<State>(original, params)));
}

// Every option survives the archive, including LAMB's booleans and an infinite max_grad_norm.
TEST(TorchLionLambSerializeOptions, LambOptionsRoundTrip) {
  const auto options = LambOptions(3e-3)
                           .betas({0.8, 0.95})
                           .eps(1e-7)
                           .weight_decay(0.2)
                           .bias_correction(false)
                           .adam_w_mode(false)
                           .grad_averaging(false)
                           .max_grad_norm(kInf)
                           .use_nvlamb(true);
  torch::Tensor w = torch::randn({5}).requires_grad_(true);
  LAMB saved({w}, options);
  LAMB loaded({w}, LambOptions());
  SaveLoad(saved, loaded);
  const auto& back = static_cast<const LambOptions&>(loaded.param_groups()[0].options());
  EXPECT_TRUE(back == options);
  EXPECT_EQ(back.max_grad_norm(), kInf);
}

// An archive written by `write`, read back.
torch::serialize::InputArchive Written(
    const std::function<void(torch::serialize::OutputArchive&)>& write) {
  torch::serialize::OutputArchive out;
  write(out);
  std::stringstream buffer;
  out.save_to(buffer);
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  return in;
}

// Lion's and LAMB's options and states as their own classes wrote them (betas a pair, Lion's state
// without a step count), and the generic classes' options under their field names (beta1, beta2),
// load into today's classes.
TEST(TorchLionLambSerializeOptions, EarlierLayoutsLoad) {
  auto lion_in = Written([](torch::serialize::OutputArchive& a) {
    a.write("lr", c10::IValue(1e-3));
    a.write("betas", c10::IValue(std::make_tuple(0.95, 0.98)));
    a.write("weight_decay", c10::IValue(0.1));
  });
  LionOptions lion;
  lion.serialize(lion_in);
  EXPECT_TRUE(lion == LionOptions(1e-3).betas({0.95, 0.98}).weight_decay(0.1));

  const torch::Tensor m = torch::randn({4});
  auto state_in = Written([&](torch::serialize::OutputArchive& a) { a.write("exp_avg", m); });
  LionParamState state;
  state.serialize(state_in);
  EXPECT_EQ(state.step(), 0);
  EXPECT_TRUE(torch::equal(state.exp_avg(), m));

  auto lamb_in = Written([](torch::serialize::OutputArchive& a) {
    a.write("lr", c10::IValue(3e-3));
    a.write("betas", c10::IValue(std::make_tuple(0.8, 0.95)));
    a.write("eps", c10::IValue(1e-7));
    a.write("weight_decay", c10::IValue(0.2));
    a.write("bias_correction", c10::IValue(false));
    a.write("adam_w_mode", c10::IValue(false));
    a.write("grad_averaging", c10::IValue(true));
    a.write("max_grad_norm", c10::IValue(2.0));
    a.write("use_nvlamb", c10::IValue(true));
  });
  LambOptions lamb;
  lamb.serialize(lamb_in);
  EXPECT_TRUE(lamb == LambOptions(3e-3)
                          .betas({0.8, 0.95})
                          .eps(1e-7)
                          .weight_decay(0.2)
                          .bias_correction(false)
                          .adam_w_mode(false)
                          .max_grad_norm(2.0)
                          .use_nvlamb(true));

  NAdamOptions want(NadamHyper{.lr = 2e-3, .beta1 = 0.8, .beta2 = 0.99});
  auto nadam_in = Written([&](torch::serialize::OutputArchive& a) {
    const NadamHyper& h = want.hyper();
    a.write("lr", c10::IValue(h.lr));
    a.write("beta1", c10::IValue(h.beta1));
    a.write("beta2", c10::IValue(h.beta2));
    a.write("eps", c10::IValue(h.eps));
    a.write("weight_decay", c10::IValue(h.weight_decay));
    a.write("momentum_decay", c10::IValue(h.momentum_decay));
    a.write("decoupled_weight_decay", c10::IValue(h.decoupled_weight_decay));
    a.write("maximize", c10::IValue(h.maximize));
  });
  NAdamOptions nadam;
  nadam.serialize(nadam_in);
  EXPECT_TRUE(nadam == want);
}

// ---- Errors -------------------------------------------------------------------------------------

torch::Tensor Param(std::int64_t n) { return torch::randn({n}).requires_grad_(true); }

TEST(TorchLionLambErrors, LionConstructorChecks) {
  const torch::Tensor w = Param(5);
  const std::string name = "fusedopt::pt::Lion";
  ExpectTorchError([&] { Lion({w}, LionOptions(0.0)); }, {name, "Invalid learning rate: 0"});
  ExpectTorchError([&] { Lion({w}, LionOptions(-1e-3)); }, {"Invalid learning rate: -0.001"});
  ExpectTorchError(
      [&] {
        Lion({w}, LionOptions().betas({1.5, 0.9}));
      },
      {name, "Invalid beta parameter at index 0: 1.5"});
  ExpectTorchError(
      [&] {
        Lion({w}, LionOptions().betas({0.9, -0.1}));
      },
      {"Invalid beta parameter at index 1: -0.1"});
  ExpectTorchError([&] { Lion({w}, LionOptions().weight_decay(-0.1)); },
                   {name, "Invalid weight_decay value: -0.1"});
  ExpectTorchError([&] { Lion({w}, LionOptions().weight_decay(std::nan(""))); },
                   {"Invalid weight_decay value"});
  Lion({w}, LionOptions().betas({1.0, 1.0}));  // lion-pytorch allows betas of 1
}

TEST(TorchLionLambErrors, LambConstructorChecks) {
  const torch::Tensor w = Param(5);
  const std::string name = "fusedopt::pt::LAMB";
  ExpectTorchError([&] { LAMB({w}, LambOptions(-1.0)); }, {name, "Invalid learning rate: -1"});
  ExpectTorchError([&] { LAMB({w}, LambOptions().eps(-1e-6)); },
                   {name, "Invalid epsilon value: -1e-06"});
  ExpectTorchError(
      [&] {
        LAMB({w}, LambOptions().betas({1.0, 0.999}));
      },
      {name, "Invalid beta parameter at index 0: 1"});
  ExpectTorchError(
      [&] {
        LAMB({w}, LambOptions().betas({0.9, 1.0}));
      },
      {"Invalid beta parameter at index 1: 1"});
  ExpectTorchError([&] { LAMB({w}, LambOptions().weight_decay(-0.01)); },
                   {name, "Invalid weight_decay value: -0.01"});
  ExpectTorchError([&] { LAMB({w}, LambOptions().max_grad_norm(-1.0)); },
                   {name, "Invalid max_grad_norm value: -1"});
  ExpectTorchError([&] { LAMB({w}, LambOptions().max_grad_norm(std::nan(""))); },
                   {"Invalid max_grad_norm value"});
  // valid: lr 0 (apex), max_grad_norm 0 and inf
  EXPECT_NO_THROW(LAMB({w}, LambOptions(0.0).max_grad_norm(0.0)));
  EXPECT_NO_THROW(LAMB({w}, LambOptions().max_grad_norm(kInf)));
}

// A group's own options are kept where they differ from the constructor defaults; the fields left
// at their constructor defaults come from the optimizer's defaults (libtorch 2.13's rule). Also for
// add_param_group, called on the optimizer.
TEST(TorchLionLambErrors, GroupOptionsMergeWithDefaults) {
  const torch::Tensor a = Param(3);
  const torch::Tensor b = Param(4);
  const torch::Tensor c = Param(5);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{a});
  groups.emplace_back(std::vector<torch::Tensor>{b},
                      std::make_unique<LambOptions>(LambOptions(5e-3).adam_w_mode(false)));
  const auto defaults = LambOptions(2e-3).weight_decay(0.3).max_grad_norm(4.0);
  LAMB opt(groups, defaults);
  opt.add_param_group(torch::optim::OptimizerParamGroup(
      {c}, std::make_unique<LambOptions>(LambOptions().eps(1e-9))));
  const auto group = [&](std::size_t g) -> const LambOptions& {
    return static_cast<const LambOptions&>(opt.param_groups().at(g).options());
  };
  EXPECT_TRUE(group(0) == defaults);
  EXPECT_TRUE(group(1) == LambOptions(defaults).lr(5e-3).adam_w_mode(false));
  EXPECT_TRUE(group(2) == LambOptions(defaults).eps(1e-9));
}

TEST(TorchLionLambErrors, GroupOptionsOfAnotherOptimizer) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{Param(3)},
                      std::make_unique<torch::optim::AdamOptions>(1e-3));
  ExpectTorchError([&] { Lion(groups, LionOptions()); },
                   {"fusedopt::pt::Lion", "options must be fusedopt::pt::LionOptions"});
  ExpectTorchError([&] { LAMB(groups, LambOptions()); },
                   {"fusedopt::pt::LAMB", "options must be fusedopt::pt::LambOptions"});
}

TEST(TorchLionLambErrors, NonLeafParam) {
  const torch::Tensor leaf = Param(4);
  const torch::Tensor non_leaf = leaf * 2;
  ExpectTorchError([&] { Lion({non_leaf}); }, {"can't optimize a non-leaf Tensor"});
}

// As the other classes: a param listed twice would be updated twice in one parallel pass.
TEST(TorchLionLambErrors, ParamGivenTwice) {
  const torch::Tensor w = Param(8);
  const torch::Tensor before = w.detach().clone();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w});
  groups.emplace_back(std::vector<torch::Tensor>{w});
  LAMB lamb(groups, LambOptions());
  w.mutable_grad() = torch::randn({8});
  ExpectTorchError([&] { lamb.step(); }, {"fusedopt::pt::LAMB", "param_groups[0].params[0]",
                                          "param_groups[1].params[0]", "share memory"});
  Lion lion({w, w}, LionOptions());
  ExpectTorchError([&] { lion.step(); }, {"fusedopt::pt::Lion", "param_groups[0].params[0]",
                                          "param_groups[0].params[1]", "share memory"});
  EXPECT_TRUE(torch::equal(w.detach(), before));
  EXPECT_TRUE(lamb.state().empty());
  EXPECT_TRUE(lion.state().empty());
}

TEST(TorchLionLambErrors, NonContiguousParam) {
  const torch::Tensor w = torch::randn({4, 6}).t().requires_grad_(true);
  Lion opt({w}, LionOptions());
  w.mutable_grad() = torch::randn({6, 4});
  ExpectTorchError([&] { opt.step(); },
                   {"fusedopt::pt::Lion", "param_groups[0].params[0]", "not contiguous"});
}

// Options that the step rejects (live options set after construction, LAMB's clipping rules):
// c10::Error naming the option, and no param, state or step count changed.
TEST(TorchLionLambErrors, RejectedStepsChangeNothing) {
  Params params = MakeParams(33);
  const auto options = TestOptions(LambOptions{});
  LAMB opt(MakeGroups(params, options), options);
  SetGrads(params, 0);
  opt.step();
  SetGrads(params, 1);
  const Params before = CloneParams(params);
  const auto states = SnapshotStates<LambParamState>(opt, params);
  auto& group1 = static_cast<LambOptions&>(opt.param_groups()[1].options());
  const auto expect_unchanged = [&] {
    EXPECT_TRUE(BitwiseEqual(params, before));
    EXPECT_TRUE(SameStates(SnapshotStates<LambParamState>(opt, params), states));
  };

  group1.lr(-1.0);  // caught by the core's validation
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::LAMB", "lr", "-1"});
  expect_unchanged();
  group1.lr(options.lr());

  group1.max_grad_norm(-1.0);
  ExpectTorchError([&] { opt.step(); },
                   {"fusedopt::pt::LAMB", "Invalid max_grad_norm value of param_groups[1]: -1"});
  expect_unchanged();
  group1.max_grad_norm(3.0);  // one global threshold: the groups must agree
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::LAMB", "max_grad_norm", "param_groups[0]",
                                         "param_groups[1] has 3"});
  expect_unchanged();
  group1.max_grad_norm(options.max_grad_norm());

  opt.training().max_grad_norm = 1.0;  // LAMB clips with its own option
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::LAMB", "training().max_grad_norm"});
  expect_unchanged();
  opt.training().max_grad_norm = kInf;
  opt.training().norm_type = NormType::kL1;
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::LAMB", "norm_type"});
  expect_unchanged();
  opt.training().norm_type = NormType::kL2;

  opt.step();  // the same step, now valid
  EXPECT_TRUE(opt.last_step().stepped);
  EXPECT_FALSE(BitwiseEqual(params, before));
}

TEST(TorchLionLambErrors, InvalidLiveLionOption) {
  const torch::Tensor w = Param(5);
  const torch::Tensor before = w.detach().clone();
  Lion opt({w}, LionOptions());
  static_cast<LionOptions&>(opt.param_groups()[0].options()).betas({0.9, 1.5});
  w.mutable_grad() = torch::randn({5});
  ExpectTorchError([&] { opt.step(); }, {"fusedopt::pt::Lion", "beta2", "1.5"});
  EXPECT_TRUE(torch::equal(w.detach(), before));
  EXPECT_TRUE(opt.state().empty());
}

// ---- Training-loop features ---------------------------------------------------------------------

// A scripted run, as training_test.cc's ExpectScalerSkips: grads multiplied by the scaler's scale
// (a power of two, so unscaling is exact), Inf/NaN injected on some steps. A skipped step leaves
// params, every state tensor and step count bit-identical and creates no state; the scaled run
// equals a plain one that takes only the good steps, bit for bit (LAMB: with its clipping, whose
// norm is that of the unscaled grads).
template <class A>
void ExpectScalerSkips(const typename A::Options& options) {
  using State = typename A::State;
  const Params a = MakeParams(34);
  const Params b = CloneParams(a);
  typename A::Optimizer fa(MakeGroups(a, options), options);
  typename A::Optimizer fb(MakeGroups(b, options), options);
  LossScaler scaler({.init_scale = 1024.0f, .growth_interval = 2});
  fa.training().scaler = &scaler;

  const float inf = std::numeric_limits<float>::infinity();
  // t -> what to inject into param_groups[0].params[1][1][2] (0: nothing); that param has a grad
  // on these steps (HasGrad).
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
    const auto states_before = SnapshotStates<State>(fa, a);
    EXPECT_EQ(scaler.scale(), expected_scale);

    fa.step();
    const bool skip = inject[t] != 0;
    EXPECT_EQ(fa.last_step().stepped, !skip);
    EXPECT_EQ(fa.last_step().found_inf, skip);
    if (skip) {
      EXPECT_TRUE(BitwiseEqual(a, before));
      EXPECT_TRUE(SameStates(SnapshotStates<State>(fa, a), states_before));
      expected_scale *= 0.5f;
      good_in_a_row = 0;
    } else {
      fb.step();
      if (++good_in_a_row == 2) {
        expected_scale *= 2.0f;
        good_in_a_row = 0;
      }
      if (fb.last_step().grad_norm.has_value()) {
        ASSERT_TRUE(fa.last_step().grad_norm.has_value());
        EXPECT_EQ(*fa.last_step().grad_norm, *fb.last_step().grad_norm);
      }
    }
    EXPECT_EQ(scaler.scale(), expected_scale);
    EXPECT_TRUE(BitwiseEqual(a, b)) << "max rel diff " << MaxRelDiff(a, b);
    EXPECT_TRUE(SameStates(SnapshotStates<State>(fa, a), SnapshotStates<State>(fb, b)));
  }
  EXPECT_EQ(fa.state().size(), fb.state().size());
}

TEST(TorchLionLambTraining, ScalerSkipsLion) {
  ExpectScalerSkips<LionAlgo>(TestOptions(LionOptions{}));
}
TEST(TorchLionLambTraining, ScalerSkipsLambClipping) {
  ExpectScalerSkips<LambAlgo>(TestOptions(LambOptions{}));
}
TEST(TorchLionLambTraining, ScalerSkipsLambNoClipping) {
  ExpectScalerSkips<LambAlgo>(TestOptions(LambOptions{}).max_grad_norm(kInf));
}

// Lion takes training()'s torch-rule clipping like the other classes: the same as
// fusedopt::pt::ClipGradNorm followed by a plain step, bit for bit.
TEST(TorchLionLambTraining, LionClipInStep) {
  const auto options = TestOptions(LionOptions{});
  const Params a = MakeParams(35);
  const Params b = CloneParams(a);
  Lion fa(MakeGroups(a, options), options);
  Lion fb(MakeGroups(b, options), options);
  fa.training().max_grad_norm = 1.0;
  for (int t = 0; t < 6; ++t) {
    SetGrads(a, t);
    SetGrads(b, t);
    fa.step();
    const double norm = ClipGradNorm(Flat(b), 1.0);
    fb.step();
    ASSERT_TRUE(fa.last_step().grad_norm.has_value());
    EXPECT_EQ(*fa.last_step().grad_norm, norm);
    EXPECT_LT(fa.last_step().clip_coef, 1.0f);
  }
  EXPECT_TRUE(BitwiseEqual(a, b)) << "max rel diff " << MaxRelDiff(a, b);
}

}  // namespace
}  // namespace fusedopt::pt::test
