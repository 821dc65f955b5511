// training().state_dtype in fusedopt::pt: 8-bit block-wise states (uint8) and 16-bit states of f32
// params. The reference is the core's fusedopt::Optimizer<Hyper> with StorageOptions::state_dtype
// (its 8-bit step is checked against bitsandbytes in tests/python/test_8bit_states.py), given the
// same params, grads and per-param step schedule: params, codes, absmax and f32 states bit for bit.
// Then: conversion of held states when the option changes (equal to quantizing or dequantizing
// them by hand), torch::save/torch::load and SaveCheckpoint/LoadCheckpoint mid-run (the codes and
// absmax continue bit for bit), and the errors (no state changed).

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/pt/checkpoint.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/quantize.h"
#include "src/torch/optim_traits.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {
namespace {

// Two groups; the tensors of 4096 elements or more (kMin8bitSize) get 8-bit states, the two small
// ones keep f32. 5000 ends in a partial block.
Params MakeModel(std::uint64_t seed) {
  torch::manual_seed(seed);
  Params params(2);
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{5000}, {7}}) {
    params[0].push_back(torch::randn(shape).requires_grad_(true));
  }
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{64, 80}, {300}}) {
    params[1].push_back(torch::randn(shape).requires_grad_(true));
  }
  return params;
}

std::vector<torch::Tensor> Flat(const Params& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& group : params) flat.insert(flat.end(), group.begin(), group.end());
  return flat;
}

template <class Hyper>
using Class = typename ClassOf<Hyper>::type;
template <class Hyper>
using Traits = detail::TraitsOf<Hyper>;

// The options of each algorithm under test, with every state slot in use.
template <class Hyper>
typename ClassOf<Hyper>::Options OptionsOf() {
  if constexpr (std::is_same_v<Hyper, AdamWHyper>) {
    return torch::optim::AdamWOptions(1e-2).amsgrad(true);
  } else if constexpr (std::is_same_v<Hyper, SgdHyper>) {
    return torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true);
  } else if constexpr (std::is_same_v<Hyper, RmspropHyper>) {
    return torch::optim::RMSpropOptions(1e-3).centered(true).momentum(0.9);
  } else if constexpr (std::is_same_v<Hyper, AdagradHyper>) {
    return torch::optim::AdagradOptions(5e-2).initial_accumulator_value(0.1);
  } else if constexpr (std::is_same_v<Hyper, LionHyper>) {
    return LionOptions(1e-3).weight_decay(0.1);
  } else if constexpr (std::is_same_v<Hyper, LambHyper>) {
    // weight_decay 0.01: the trust ratio in use; without apex's clipping, which the core's Step()
    // applies only when told to
    return LAMBOptions(1e-2).max_grad_norm(std::numeric_limits<double>::infinity());
  } else {
    return typename ClassOf<Hyper>::Options(NadamHyper{.lr = 2e-3, .momentum_decay = 4e-3});
  }
}

// A fusedopt::pt optimizer over its own copy of the model.
template <class Hyper>
struct PtRun {
  Params params = MakeModel(7);
  std::unique_ptr<Class<Hyper>> opt =
      std::make_unique<Class<Hyper>>(MakeGroups(params, OptionsOf<Hyper>()), OptionsOf<Hyper>());

  explicit PtRun(std::optional<c10::ScalarType> state_dtype) {
    opt->training().state_dtype = state_dtype;
  }
  void Step(int t) {
    SetGrads(params, t);
    opt->step();
  }
  // Param i's (flat index) state object, or null before its first step.
  typename Traits<Hyper>::State* State(std::size_t i) {
    const auto it = opt->state().find(Flat(params)[i].unsafeGetTensorImpl());
    if (it == opt->state().end()) return nullptr;
    return dynamic_cast<typename Traits<Hyper>::State*>(it->second.get());
  }
};

// The core's Optimizer on the same model, grads and schedule.
template <class Hyper>
struct CoreRun {
  fusedopt::Optimizer<Hyper> opt;

  CoreRun(const PtRun<Hyper>& pt, DType state_dtype)
      : opt(Hypers(pt), Specs(pt.params), {.state_dtype = state_dtype}) {
    const auto flat = Flat(pt.params);
    for (std::size_t i = 0; i < flat.size(); ++i) {
      std::memcpy(opt.storage().template params<float>(i).data(), flat[i].const_data_ptr(),
                  flat[i].nbytes());
    }
  }
  static std::vector<Hyper> Hypers(const PtRun<Hyper>& pt) {
    std::vector<Hyper> hypers;
    for (const auto& group : pt.opt->param_groups()) {
      hypers.push_back(Traits<Hyper>::ToHyper(
          static_cast<const typename Traits<Hyper>::Options&>(group.options())));
    }
    return hypers;
  }
  static std::vector<TensorSpec> Specs(const Params& params) {
    std::vector<TensorSpec> specs;
    for (std::uint32_t g = 0; g < params.size(); ++g) {
      for (const auto& p : params[g]) {
        specs.push_back({.numel = static_cast<std::size_t>(p.numel()), .group = g});
      }
    }
    return specs;
  }
  // The step of pt's step t: the params that have a grad there (their grads copied).
  void Step(const Params& params, int t) {
    SetGrads(params, t);
    const auto flat = Flat(params);
    std::vector<std::size_t> stepped;
    for (std::size_t i = 0; i < flat.size(); ++i) {
      if (!flat[i].grad().defined()) continue;
      std::memcpy(opt.storage().template grads<float>(i).data(), flat[i].grad().const_data_ptr(),
                  flat[i].grad().nbytes());
      stepped.push_back(i);
    }
    opt.StepTensors(stepped);
  }
};

bool SameBytes(const torch::Tensor& t, const void* data, std::size_t bytes) {
  return static_cast<std::size_t>(t.nbytes()) == bytes &&
         std::memcmp(t.contiguous().const_data_ptr(), data, bytes) == 0;
}

// pt's params and every state it holds equal the core's, bit for bit: 8-bit codes with their
// absmax where the core keeps them, states of the core's dtype elsewhere.
template <class Hyper>
void ExpectSame(PtRun<Hyper>& pt, CoreRun<Hyper>& core) {
  const auto flat = Flat(pt.params);
  FlatStorage& storage = core.opt.storage();
  for (std::size_t i = 0; i < flat.size(); ++i) {
    const Segment& seg = storage.segments()[i];
    EXPECT_TRUE(SameBytes(flat[i].detach(), seg.param, seg.numel * 4)) << "param " << i;
    auto* state = pt.State(i);
    ASSERT_NE(state, nullptr) << "param " << i;
    const auto slots = Traits<Hyper>::Slots(*state);
    const unsigned required = RequiredStates(core.opt.group(seg.group));
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if ((required >> slot & 1u) == 0) continue;
      const torch::Tensor& held = *slots[slot];
      ASSERT_EQ(detail::ToDType(held), seg.state_dtype) << "param " << i << " slot " << slot;
      EXPECT_TRUE(SameBytes(held, seg.state[slot], seg.numel * DTypeSize(seg.state_dtype)))
          << "param " << i << " slot " << slot;
      if (seg.state_dtype != DType::kQ8) continue;
      const auto* absmax = dynamic_cast<const StateAbsmax*>(state);
      ASSERT_NE(absmax, nullptr);
      const std::span<float> want = storage.absmax(i, slot);
      EXPECT_TRUE(SameBytes(absmax->absmax[slot], want.data(), want.size_bytes()))
          << "absmax of param " << i << " slot " << slot;
    }
  }
}

// Six steps of pt with state_dtype and of the core with `core_dtype`, compared after each.
template <class Hyper>
void ExpectSameAsCore(c10::ScalarType state_dtype, DType core_dtype) {
  PtRun<Hyper> pt(state_dtype);
  CoreRun<Hyper> core(pt, core_dtype);
  for (int t = 0; t < 6; ++t) {
    pt.Step(t);
    core.Step(pt.params, t);
    if (t >= 2) ExpectSame(pt, core);  // by then every param has stepped (HasGrad)
  }
}

template <class H>
class TorchStateDtype : public ::testing::Test {};
// The drop-ins (Adagrad's states are torch's own from its constructor, which the first 8-bit step
// replaces), a generic class, NAdam with a scalar state and both maps, and LAMB, whose per-tensor
// sums read the decoded states.
using Algorithms = ::testing::Types<AdamWHyper, SgdHyper, RmspropHyper, AdagradHyper, LionHyper,
                                    NadamHyper, LambHyper>;
TYPED_TEST_SUITE(TorchStateDtype, Algorithms);

TYPED_TEST(TorchStateDtype, EightBitEqualsCore) {
  ExpectSameAsCore<TypeParam>(torch::kUInt8, DType::kQ8);
}

TYPED_TEST(TorchStateDtype, Bf16StatesEqualCore) {
  ExpectSameAsCore<TypeParam>(torch::kBFloat16, DType::kBF16);
}

// torch::save mid-run and torch::load into a fresh optimizer: the codes and absmax come back (as
// a ParamStateWithAbsmax for a drop-in) and both runs continue bit for bit.
TYPED_TEST(TorchStateDtype, SaveLoadContinues) {
  PtRun<TypeParam> a(torch::kUInt8);
  for (int t = 0; t < 3; ++t) a.Step(t);
  std::stringstream stream;
  torch::save(*a.opt, stream);
  PtRun<TypeParam> b(torch::kUInt8);
  for (std::size_t g = 0; g < 2; ++g) {
    for (std::size_t i = 0; i < b.params[g].size(); ++i) {
      b.params[g][i].detach().copy_(a.params[g][i].detach());
    }
  }
  torch::load(*b.opt, stream);
  auto* loaded = b.State(0);
  ASSERT_NE(loaded, nullptr);
  ASSERT_NE(dynamic_cast<StateAbsmax*>(loaded), nullptr);
  EXPECT_EQ(Traits<TypeParam>::Slots(*loaded)[0]->scalar_type(), torch::kByte);
  EXPECT_TRUE(dynamic_cast<StateAbsmax*>(loaded)->absmax[0].defined());
  for (int t = 3; t < 6; ++t) {
    a.Step(t);
    b.Step(t);
  }
  EXPECT_TRUE(BitwiseEqual(a.params, b.params));
  for (std::size_t i = 0; i < 4; ++i) {
    auto* sa = a.State(i);
    auto* sb = b.State(i);
    for (int slot = 0; slot < kMaxStates; ++slot) {
      const auto* ta = Traits<TypeParam>::Slots(*sa)[slot];
      if (ta == nullptr || !ta->defined()) continue;
      EXPECT_TRUE(torch::equal(*ta, *Traits<TypeParam>::Slots(*sb)[slot])) << i << " " << slot;
      if (ta->scalar_type() == torch::kByte) {
        EXPECT_TRUE(torch::equal(dynamic_cast<StateAbsmax&>(*sa).absmax[slot],
                                 dynamic_cast<StateAbsmax&>(*sb).absmax[slot]));
      }
    }
  }
}

// The same through the checkpoint format (SaveCheckpoint / LoadCheckpoint): codes and
// "<key>_absmax" entries, continued bit for bit.
TEST(TorchStateDtypeCheckpoint, EightBitContinues) {
  PtRun<AdamWHyper> a(torch::kUInt8);
  for (int t = 0; t < 3; ++t) a.Step(t);
  const std::string path =
      (std::filesystem::temp_directory_path() / "fusedopt_pt_8bit.safetensors").string();
  SaveCheckpoint(*a.opt, path);
  PtRun<AdamWHyper> b(torch::kUInt8);
  LoadCheckpoint(*b.opt, path);  // the params travel in the file
  std::filesystem::remove(path);
  for (std::size_t g = 0; g < 2; ++g) {
    for (std::size_t i = 0; i < b.params[g].size(); ++i) {
      ASSERT_TRUE(torch::equal(a.params[g][i], b.params[g][i]));
    }
  }
  for (int t = 3; t < 6; ++t) {
    a.Step(t);
    b.Step(t);
  }
  EXPECT_TRUE(BitwiseEqual(a.params, b.params));
  EXPECT_TRUE(torch::equal(a.State(2)->exp_avg_sq(), b.State(2)->exp_avg_sq()));
}

// Held states change form at the next step when the option changes: the same as quantizing
// (f32 -> 8-bit) or dequantizing (8-bit -> f32) them by hand before that step.
TEST(TorchStateDtypeConvert, BothWays) {
  using D = algos::DescriptorOf<NadamHyper>;
  for (const bool to_8bit : {true, false}) {
    const std::optional<c10::ScalarType> before =
        to_8bit ? std::nullopt : std::optional(torch::kUInt8);
    const std::optional<c10::ScalarType> after =
        to_8bit ? std::optional(torch::kUInt8) : std::nullopt;
    PtRun<NadamHyper> a(before), b(before);
    for (int t = 0; t < 3; ++t) {
      a.Step(t);
      b.Step(t);
    }
    for (std::size_t i = 0; i < 4; ++i) {
      auto* s = b.State(i);
      const auto n = static_cast<std::size_t>(s->tensors[0].numel());
      if (n < kMin8bitSize) continue;
      for (int slot = 0; slot < 2; ++slot) {
        const QuantMap map = SlotMap(D::kUnsignedMapStates, slot);
        torch::Tensor& held = s->tensors[slot];
        if (to_8bit) {
          torch::Tensor codes = torch::empty(held.sizes(), torch::kByte);
          torch::Tensor absmax = torch::empty({static_cast<std::int64_t>(NumQuantBlocks(n))});
          Quantize(held.const_data_ptr<float>(), n, map, codes.data_ptr<std::uint8_t>(),
                   absmax.data_ptr<float>());
          held = codes;
          s->absmax[slot] = absmax;
        } else {
          torch::Tensor values = torch::empty(held.sizes());
          Dequantize(held.const_data_ptr<std::uint8_t>(), s->absmax[slot].const_data_ptr<float>(),
                     n, map, values.data_ptr<float>());
          held = values;
          s->absmax[slot] = torch::Tensor();
        }
      }
    }
    a.opt->training().state_dtype = after;
    b.opt->training().state_dtype = after;
    for (int t = 3; t < 5; ++t) {
      a.Step(t);
      b.Step(t);
    }
    EXPECT_TRUE(BitwiseEqual(a.params, b.params)) << "to_8bit " << to_8bit;
    const auto* s = a.State(0);
    EXPECT_EQ(s->tensors[0].scalar_type(), to_8bit ? torch::kByte : torch::kFloat);
    EXPECT_EQ(s->absmax[0].defined(), to_8bit);
    EXPECT_TRUE(torch::equal(s->tensors[1], b.State(0)->tensors[1]));
  }
}

// Each refusal changes nothing: params, states and step counts as they were.
TEST(TorchStateDtypeErrors, RefusedStepsChangeNothing) {
  {  // 8-bit states for an algorithm whose sums are per row of a tensor
    Params params = MakeModel(3);
    AdamP adamp(Flat(params), AdamPOptions{});
    adamp.training().state_dtype = torch::kUInt8;
    SetGrads(params, 0);
    const Params before = CloneParams(params);
    ExpectTorchError([&] { adamp.step(); }, {"fusedopt::pt::AdamP", "state_dtype uint8"});
    EXPECT_TRUE(BitwiseEqual(params, before));
    EXPECT_TRUE(adamp.state().empty());
  }
  {  // a dtype states cannot have
    PtRun<AdamWHyper> run(torch::kDouble);
    SetGrads(run.params, 0);
    ExpectTorchError([&] { run.opt->step(); }, {"state_dtype", "Double"});
    EXPECT_TRUE(run.opt->state().empty());
  }
  {  // 8-bit codes whose absmax is gone
    PtRun<AdamWHyper> run(torch::kUInt8);
    run.Step(0);
    run.Step(1);
    auto* state = run.State(0);
    dynamic_cast<StateAbsmax&>(*state).absmax[0] = torch::Tensor();
    const Params before = CloneParams(run.params);
    const torch::Tensor exp_avg_sq = state->exp_avg_sq().clone();
    const std::int64_t step = state->step();
    SetGrads(run.params, 2);
    ExpectTorchError([&] { run.opt->step(); },
                     {"param_groups[0].params[0]", "8-bit codes", "'exp_avg_absmax'"});
    EXPECT_TRUE(BitwiseEqual(run.params, before));
    EXPECT_TRUE(torch::equal(state->exp_avg_sq(), exp_avg_sq));
    EXPECT_EQ(state->step(), step);
  }
}

}  // namespace
}  // namespace fusedopt::pt::test
