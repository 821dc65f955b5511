// fusedopt::pt's generic classes (FusedOptimizer<Hyper>: every algorithm without a torch::optim
// twin), which libtorch has no twin of, each with its cases from tests/reference/<algo>.h (the
// suite names are the ones ctest runs; some classes have suites of their own beside these):
//   TorchGenericGolden  typed over the registry's generic classes: tests/golden/<algo>.json
//                       (written by tools/make_golden.py) replayed through each class
//                       (golden_replay.h)
//   TorchGeneric        typed over the same classes: torch::save mid-run and torch::load into an
//                       optimizer built with other defaults (options and state, scalar states too,
//                       compare equal and both continue bit for bit); the state keys, dtypes and
//                       shapes, and the scalar states' values; construction and group checks
//                       naming the option (a rejected group is not kept), group options merged
//                       with the defaults, another optimizer's options refused; a param the engine
//                       cannot take is an error that changes nothing; a LossScaler's Inf skip
//                       leaves params, states, scalar states and step counts bit-identical; set_lr
//                       as schedulers use it; SaveCheckpoint mid-run and LoadCheckpoint continue
//                       bit for bit

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/checkpoint.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/scaler.h"
#include "src/algos/registry.h"
#include "tests/reference/reference.h"
#include "tests/torch/golden_replay.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

// Every algorithm whose class is the generic FusedOptimizer<Hyper> (those without a torch::optim
// twin), from the registry: the hypers of algos::All whose ClassOf is it.
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
// or the reference tools/make_golden.py runs for the algorithm (its golden file names it; some
// clip globally, per group or per (group, dtype), which the class's one step over all groups does;
// some project or factor matrices per row, layer or batch).
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

// Each algorithm's cases, in its file tests/reference/<algo>.h (ref::TorchCase<Hyper>):
//   TestHyper()                 options away from the defaults (weight decay on where it has one,
//                               and a knob of its own)
//   kTensorKeys                 torch's state keys of its tensors (in the param's dtype)
// and, only where they hold:
//   ForEachScalar(f)            f(key, value, tolerance) for each 0-d f32 scalar state: its value
//                               after one step of TestHyper(), from torch's formulas
//   kFactoredDims               per tensor key, the dimension it averages out (-1: the last, -2:
//                               the one before; 0: none): such states of a matrix are factors
//   kRefusesEmptyParams         a param of no elements is an error
//   kTakesNegativeWeightDecay   its reference checks no sign of weight_decay
//   kLrError, kWeightDecayError the constructor's words before a bad value, where they are its
//                               reference's rather than "invalid lr: " and "invalid weight_decay: "
//   StepSizeFloor()             lr is only the first step size, which a clamp raises to this
//                               floor: at lr 0 a param still moves, by at most it
template <class Hyper>
using CaseOf = ref::TorchCase<Hyper>;

template <class Hyper>
constexpr bool RefusesEmptyParams() {
  if constexpr (requires { CaseOf<Hyper>::kRefusesEmptyParams; }) {
    return CaseOf<Hyper>::kRefusesEmptyParams;
  }
  return false;
}
template <class Hyper>
constexpr bool TakesNegativeWeightDecay() {
  if constexpr (requires { CaseOf<Hyper>::kTakesNegativeWeightDecay; }) {
    return CaseOf<Hyper>::kTakesNegativeWeightDecay;
  }
  return false;
}

template <class Hyper>
std::string LrError() {
  if constexpr (requires { CaseOf<Hyper>::kLrError; }) return CaseOf<Hyper>::kLrError;
  return "invalid lr: ";
}
template <class Hyper>
std::string WeightDecayError() {
  if constexpr (requires { CaseOf<Hyper>::kWeightDecayError; }) {
    return CaseOf<Hyper>::kWeightDecayError;
  }
  return "invalid weight_decay: ";
}

template <class Hyper>
Hyper TestHyper() {
  return CaseOf<Hyper>::TestHyper();
}

// Every generic class (the registry's, as TorchGenericGolden), each as FusedOptimizer<Hyper>.
template <class Hyper>
class TorchGeneric : public ::testing::Test {};
TYPED_TEST_SUITE(TorchGeneric, GenericOf<algos::All>::type, ReferenceName);

// The test model (test_util.h). Where a param of no elements is refused (kRefusesEmptyParams), a
// batch of matrices [2, 3, 4] takes the empty param's place (params[1][1]): the typed tests then
// also cover a factored batch.
template <class Hyper>
Params ParamsFor(std::uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  Params params = MakeParams(seed, dtype);
  if constexpr (RefusesEmptyParams<Hyper>()) {
    torch::manual_seed(seed + 1000);
    params[1][1] = torch::randn({2, 3, 4}).to(dtype).requires_grad_(true);
  }
  return params;
}

// The shape of tensor state kTensorKeys[k] of p: p's own, but a factor (kFactoredDims) has size 1
// in the dimension it averages out.
template <class Hyper>
std::vector<std::int64_t> StateShape(const torch::Tensor& p, std::size_t k) {
  std::vector<std::int64_t> shape(p.sizes().begin(), p.sizes().end());
  if constexpr (requires { CaseOf<Hyper>::kFactoredDims; }) {
    static_assert(std::size(CaseOf<Hyper>::kFactoredDims) == std::size(CaseOf<Hyper>::kTensorKeys));
    const int dim = CaseOf<Hyper>::kFactoredDims[k];
    if (dim != 0) shape[shape.size() + dim] = 1;
  }
  return shape;
}

template <class Optimizer, class Hyper>
Optimizer MakeOptimizer(const Params& params, const Hyper& hyper) {
  using Options = typename Optimizer::Options;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  Hyper second = hyper;
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
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  using Options = typename Optimizer::Options;
  const Hyper hyper = TestHyper<Hyper>();
  Params params = ParamsFor<Hyper>(41);
  Optimizer original = MakeOptimizer<Optimizer>(params, hyper);
  for (int t = 0; t < 5; ++t) {
    SetGrads(params, t);
    original.step();
  }
  Params loaded_params = CloneParams(params);
  Hyper other;
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
  StepBothAlike(original, params, loaded, loaded_params, 5, 10);
  EXPECT_TRUE(SameStates(Snapshot(loaded, loaded_params), Snapshot(original, params)));
}

// The same through the checkpoint format (SaveCheckpoint / LoadCheckpoint, which carries the
// params too): a run resumed from the file continues bit for bit. LARS and Lion save no step count
// (torch keeps none): the resumed step must still find LARS's momentum buffer not new.
TYPED_TEST(TorchGeneric, CheckpointContinuesBitForBit) {
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  const Hyper hyper = TestHyper<Hyper>();
  Params params = ParamsFor<Hyper>(43);
  Optimizer original = MakeOptimizer<Optimizer>(params, hyper);
  for (int t = 0; t < 3; ++t) {
    SetGrads(params, t);
    original.step();
  }
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("fusedopt_generic_" + ReferenceName::GetName<Hyper>(0) + ".safetensors"))
          .string();
  SaveCheckpoint(original, path);
  Params loaded_params = ParamsFor<Hyper>(44);
  Optimizer loaded = MakeOptimizer<Optimizer>(loaded_params, hyper);
  LoadCheckpoint(loaded, path);
  std::filesystem::remove(path);
  ASSERT_TRUE(BitwiseEqual(loaded_params, params));
  StepBothAlike(original, params, loaded, loaded_params, 3, 6);
}

// The state under torch's keys: tensors in the param's dtype and shape (a factor of a [33, 5]
// param: [33, 1] or [1, 5]), scalar states 0-d f32 with torch's values after one step.
TYPED_TEST(TorchGeneric, StateKeys) {
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  Params params = ParamsFor<Hyper>(42, torch::kBFloat16);
  Optimizer opt = MakeOptimizer<Optimizer>(params, TestHyper<Hyper>());
  SetGrads(params, 0);
  opt.step();
  const torch::Tensor& p = params[0][1];
  ASSERT_TRUE(p.grad().defined());
  auto& state =
      static_cast<typename Optimizer::ParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  EXPECT_EQ(state.step(), 1);
  for (std::size_t k = 0; k < std::size(CaseOf<Hyper>::kTensorKeys); ++k) {
    const std::string key = CaseOf<Hyper>::kTensorKeys[k];
    EXPECT_EQ(state.state(key).scalar_type(), torch::kBFloat16) << key;
    EXPECT_EQ(state.state(key).sizes(), torch::IntArrayRef(StateShape<Hyper>(p, k))) << key;
  }
  std::size_t checked = 0;
  const auto check_scalar = [&](const char* key, double value, double tolerance) {
    const torch::Tensor& scalar = state.state(key);
    EXPECT_EQ(scalar.dim(), 0) << key;
    EXPECT_EQ(scalar.scalar_type(), torch::kFloat) << key;
    EXPECT_NEAR(scalar.item<float>(), value, tolerance) << key;
    ++checked;
  };
  if constexpr (requires { CaseOf<Hyper>::ForEachScalar(check_scalar); }) {
    CaseOf<Hyper>::ForEachScalar(check_scalar);
  }
  // The case names every state the param has.
  const auto count = [](const auto& tensors) {
    return std::count_if(tensors.begin(), tensors.end(),
                         [](const torch::Tensor& t) { return t.defined(); });
  };
  EXPECT_EQ(count(state.tensors), std::ssize(CaseOf<Hyper>::kTensorKeys));
  EXPECT_EQ(count(state.scalars), static_cast<std::ptrdiff_t>(checked));
  ExpectTorchError([&] { state.state("max_exp_avg_sq"); }, {"has no state 'max_exp_avg_sq'"});
}

TYPED_TEST(TorchGeneric, OptionChecks) {
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  using Options = typename Optimizer::Options;
  Params params = ParamsFor<Hyper>(43);
  Hyper bad;
  bad.lr = -1.0;
  ExpectTorchError([&] { Optimizer opt(params[0], Options(bad)); }, {LrError<Hyper>() + "-1"});
  if constexpr (requires { bad.weight_decay; } && !TakesNegativeWeightDecay<Hyper>()) {
    bad = {};
    bad.weight_decay = -0.5;
    ExpectTorchError([&] { Optimizer opt(params[0], Options(bad)); },
                     {WeightDecayError<Hyper>() + "-0.5"});
  }

  // A group's own option is checked as it is added; the rejected group is not kept.
  Optimizer opt(params[0], Options(Hyper{}));
  Hyper group;
  group.lr = -1e-3;
  ExpectTorchError(
      [&] {
        opt.add_param_group(
            torch::optim::OptimizerParamGroup(params[1], std::make_unique<Options>(group)));
      },
      {"group 1", "invalid lr"});
  EXPECT_EQ(opt.param_groups().size(), 1u);

  // libtorch's merge: the fields a group sets away from their defaults, the others the defaults'
  // (TestHyper's knobs among them).
  const Hyper defaults = TestHyper<Hyper>();
  Optimizer merged(params[0], Options(defaults));
  Hyper own;
  own.lr = 0.125;
  merged.add_param_group(
      torch::optim::OptimizerParamGroup(params[1], std::make_unique<Options>(own)));
  const auto& got = static_cast<const Options&>(merged.param_groups()[1].options()).hyper();
  EXPECT_EQ(got.lr, 0.125);
  if constexpr (requires { got.weight_decay; }) {
    EXPECT_EQ(got.weight_decay, defaults.weight_decay);
  }
  algos::ForEachField<algos::DescriptorOf<Hyper>>([&](const auto& field) {
    if (std::string_view(field.name) != "lr") {
      EXPECT_EQ(got.*field.member, defaults.*field.member) << field.name;
    }
  });

  // Another optimizer's options (one fusedopt has no class of) are refused.
  ExpectTorchError(
      [&] {
        merged.add_param_group(torch::optim::OptimizerParamGroup(
            params[1], std::make_unique<torch::optim::LBFGSOptions>(1e-3)));
      },
      {"Options"});
}

// No torch::optim twin takes what the engine cannot: a float64 param is an error before anything
// changes (the other params keep their values and get no state).
TYPED_TEST(TorchGeneric, RefusedParamChangesNothing) {
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  Params params = ParamsFor<Hyper>(44);
  params[1][2] = params[1][2].detach().to(torch::kDouble).requires_grad_(true);
  Optimizer opt = MakeOptimizer<Optimizer>(params, TestHyper<Hyper>());
  SetGrads(params, 0);
  const Params before = CloneParams(params);
  ExpectTorchError([&] { opt.step(); }, {"param_groups[1].params[2]", "Double"});
  EXPECT_TRUE(BitwiseEqual(params, before));
  EXPECT_TRUE(opt.state().empty());
}

// An Inf gradient under a LossScaler skips the step: params, states (scalar states too) and step
// counts stay bit-identical and the scale halves; the next good step runs as a plain optimizer's
// does on the unscaled gradients.
TYPED_TEST(TorchGeneric, ScalerSkipChangesNothing) {
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  const Hyper hyper = TestHyper<Hyper>();
  Params a = ParamsFor<Hyper>(45);
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
  using Hyper = TypeParam;
  using Optimizer = FusedOptimizer<Hyper>;
  Params params = ParamsFor<Hyper>(46);
  Optimizer opt = MakeOptimizer<Optimizer>(params, TestHyper<Hyper>());
  auto& options = opt.param_groups()[1].options();
  options.set_lr(0.0);
  EXPECT_EQ(options.get_lr(), 0.0);
  SetGrads(params, 0);
  const Params before = CloneParams(params);
  opt.step();
  // lr 0 in group 1 leaves its params as they were (weight decay is scaled by lr too); both params
  // compared have a grad at t = 0.
  ASSERT_TRUE(params[1][2].grad().defined() && params[0][0].grad().defined());
  if constexpr (requires { CaseOf<Hyper>::StepSizeFloor(); }) {
    // lr is only the first step size, which the clamp raises to the floor, as torch's.
    const double moved = (params[1][2] - before[1][2]).abs().max().template item<double>();
    EXPECT_GT(moved, 0.0);
    EXPECT_LE(moved, CaseOf<Hyper>::StepSizeFloor() + 5e-7);  // + f32 rounding at |p| < 8
  } else {
    EXPECT_TRUE(torch::equal(params[1][2], before[1][2]));
  }
  EXPECT_FALSE(torch::equal(params[0][0], before[0][0]));
}

}  // namespace
}  // namespace fusedopt::pt::test
