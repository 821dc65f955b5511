// Saved optimizers are interchangeable with torch::optim's: torch::save a fused optimizer mid-run,
// torch::load it into a torch::optim one and back, and continue; and the reverse. The state that
// went fused -> torch -> fused must continue bit for bit like the original; a torch::optim
// optimizer continuing from fused state (or vice versa) must follow the same trajectory within
// tolerance.

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <sstream>

#include "fusedopt/pt/optim.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

constexpr double kRoundTripTolerance = 1e-5;

// One optimizer pair per test instance, with options that create every kind of state.
template <class FusedT, class ReferenceT, class OptionsT>
struct Pair {
  using Fused = FusedT;
  using Reference = ReferenceT;
  using Options = OptionsT;
};
using SgdPair = Pair<SGD, torch::optim::SGD, torch::optim::SGDOptions>;
using AdamPair = Pair<Adam, torch::optim::Adam, torch::optim::AdamOptions>;
using AdamWPair = Pair<AdamW, torch::optim::AdamW, torch::optim::AdamWOptions>;
using RmspropPair = Pair<RMSprop, torch::optim::RMSprop, torch::optim::RMSpropOptions>;
using AdagradPair = Pair<Adagrad, torch::optim::Adagrad, torch::optim::AdagradOptions>;

torch::optim::SGDOptions OptionsFor(SgdPair) {
  return torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true);
}
torch::optim::AdamOptions OptionsFor(AdamPair) {
  return torch::optim::AdamOptions(1e-2).amsgrad(true).weight_decay(1e-2);
}
torch::optim::AdamWOptions OptionsFor(AdamWPair) {
  return torch::optim::AdamWOptions(1e-2).amsgrad(true);
}
torch::optim::RMSpropOptions OptionsFor(RmspropPair) {
  return torch::optim::RMSpropOptions(1e-3).centered(true).momentum(0.9);
}
torch::optim::AdagradOptions OptionsFor(AdagradPair) {
  return torch::optim::AdagradOptions(5e-2).lr_decay(0.01).initial_accumulator_value(0.1);
}

template <class P>
class TorchSerialize : public ::testing::Test {};
using Pairs = ::testing::Types<SgdPair, AdamPair, AdamWPair, RmspropPair, AdagradPair>;
TYPED_TEST_SUITE(TorchSerialize, Pairs);

constexpr int kBefore = 5;  // steps before the save
constexpr int kAfter = 5;   // steps after the load

// Takes steps [first, first + count) of the shared grad schedule on each (params, optimizer) pair.
template <class... Opts>
void Steps(int first, int count, std::pair<Params*, Opts*>... runs) {
  for (int t = first; t < first + count; ++t) {
    ((SetGrads(*runs.first, t), runs.second->step()), ...);
  }
}

template <class Saved, class Loaded>
void SaveLoad(const Saved& from, Loaded& to) {
  std::stringstream buffer;
  torch::save(from, buffer);
  torch::load(to, buffer);
}

TYPED_TEST(TorchSerialize, FusedToTorchAndBack) {
  using Fused = typename TypeParam::Fused;
  using Reference = typename TypeParam::Reference;
  const auto options = OptionsFor(TypeParam{});

  Params fused_params = MakeParams(11);
  Fused fused(MakeGroups(fused_params, options), options);
  Steps(0, kBefore, std::pair{&fused_params, &fused});

  // fused -> torch::optim (saved/loaded with torch's own format) -> a second fused optimizer.
  Params torch_params = CloneParams(fused_params);
  Reference reference(MakeGroups(torch_params, options), options);
  SaveLoad(fused, reference);
  Params fused2_params = CloneParams(fused_params);
  Fused fused2(MakeGroups(fused2_params, options), options);
  SaveLoad(reference, fused2);
  ASSERT_EQ(fused2.state().size(), fused.state().size());

  Steps(kBefore, kAfter, std::pair{&fused_params, &fused}, std::pair{&fused2_params, &fused2},
        std::pair{&torch_params, &reference});
  EXPECT_TRUE(BitwiseEqual(fused2_params, fused_params))
      << "max rel diff " << MaxRelDiff(fused2_params, fused_params);
  ExpectClose(torch_params, fused_params, kRoundTripTolerance);
}

TYPED_TEST(TorchSerialize, TorchToFused) {
  using Fused = typename TypeParam::Fused;
  using Reference = typename TypeParam::Reference;
  const auto options = OptionsFor(TypeParam{});

  Params torch_params = MakeParams(12);
  Reference reference(MakeGroups(torch_params, options), options);
  Steps(0, kBefore, std::pair{&torch_params, &reference});

  Params fused_params = CloneParams(torch_params);
  Fused fused(MakeGroups(fused_params, options), options);
  SaveLoad(reference, fused);
  ASSERT_EQ(fused.state().size(), reference.state().size());

  Steps(kBefore, kAfter, std::pair{&torch_params, &reference}, std::pair{&fused_params, &fused});
  ExpectClose(fused_params, torch_params, kRoundTripTolerance);
}

// State saved from an f32 model and loaded into the same model in bf16 is converted to the param's
// dtype on the next step (as torch's load_state_dict casts state), and the step count continues.
TEST(TorchSerializeDtype, F32StateIntoBf16Model) {
  const auto options = torch::optim::AdamOptions(1e-2);
  Params f32_params = MakeParams(13);
  Adam f32_opt(MakeGroups(f32_params, options), options);
  Steps(0, 3, std::pair{&f32_params, &f32_opt});

  Params bf16_params = MakeParams(13, torch::kBFloat16);
  Adam bf16_opt(MakeGroups(bf16_params, options), options);
  SaveLoad(f32_opt, bf16_opt);
  Steps(3, 1, std::pair{&bf16_params, &bf16_opt});
  // Param 1 (flat index 1) has a grad at step 3: its state was converted and stepped.
  ASSERT_TRUE(HasGrad(3, 1));
  const auto& state = static_cast<const torch::optim::AdamParamState&>(
      *bf16_opt.state().at(bf16_params[0][1].unsafeGetTensorImpl()));
  int expected_step = 0;
  for (int t = 0; t < 4; ++t) expected_step += HasGrad(t, 1) ? 1 : 0;
  EXPECT_EQ(state.step(), expected_step);
  EXPECT_EQ(state.exp_avg().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(state.exp_avg_sq().scalar_type(), torch::kBFloat16);
}

}  // namespace
}  // namespace fusedopt::pt::test
