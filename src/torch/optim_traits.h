// How each fusedopt::pt optimizer maps its options and param state onto the core's hyper struct
// and Segment::state slots (fused_step.h says what a Traits struct holds): torch::optim's classes
// for SGD, Adam, AdamW, RMSprop and Adagrad, and the generic HyperOptions / HyperParamState for the
// others, whose fields and state keys are the descriptor's. The step (optim.cc) and checkpoints
// (checkpoint.cc) read them; FromHyper is ToHyper's inverse for the fields the options have.
#pragma once

#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "src/torch/fused_step.h"

namespace fusedopt::pt::detail {

using StateSlots = std::array<at::Tensor*, kMaxStates>;

// torch's options classes (SGDOptions, AdamOptions, ...) name each accessor after its param_group
// key, so the descriptor's fields (algos::Field: the group key and the part of a pair) map a
// twin's options onto its Hyper and back. The keys libtorch's options have; a field whose key
// they lack (maximize) keeps its Hyper default.
// clang-format off
#define FOPT_TORCH_OPTION_KEYS(X) \
  X(lr)                           \
  X(momentum)                     \
  X(dampening)                    \
  X(weight_decay)                 \
  X(nesterov)                     \
  X(betas)                        \
  X(eps)                          \
  X(amsgrad)                      \
  X(alpha)                        \
  X(centered)                     \
  X(lr_decay)                     \
  X(initial_accumulator_value)
// clang-format on

// f(o.key(), set) for the accessor named `key` (set(v) calls o.key(v)); nothing where o has none.
template <class Options, class F>
void WithTorchOption(Options& o, std::string_view key, F&& f) {
#define FOPT_VISIT_OPTION(name)                                                      \
  if constexpr (requires { o.name(); }) {                                            \
    if (key == #name) return f(o.name(), [&](const auto& value) { o.name(value); }); \
  }
  FOPT_TORCH_OPTION_KEYS(FOPT_VISIT_OPTION)
#undef FOPT_VISIT_OPTION
}

template <class V>
constexpr bool kIsPair = false;
template <class A, class B>
constexpr bool kIsPair<std::tuple<A, B>> = true;

// A field of Hyper from torch's options value of its key (a pair's part `index`), and back.
template <class T, class V>
T FieldValue(const V& value, int index) {
  if constexpr (kIsPair<V>) {
    return static_cast<T>(index == 0 ? std::get<0>(value) : std::get<1>(value));
  } else {
    return static_cast<T>(value);
  }
}
template <class V, class T>
V WithField(V value, int index, const T& field) {
  if constexpr (kIsPair<V>) {
    auto& part = index == 0 ? std::get<0>(value) : std::get<1>(value);
    part = static_cast<std::decay_t<decltype(part)>>(field);
  } else {
    value = static_cast<V>(field);
  }
  return value;
}

template <class Hyper, class Options>
Hyper HyperOfTorchOptions(const Options& o) {
  Hyper h;
  algos::ForEachField<algos::DescriptorOf<Hyper>>([&](const auto& field) {
    WithTorchOption(o, field.GroupKey(), [&](const auto& value, const auto& /*set*/) {
      auto& member = h.*field.member;
      member = FieldValue<std::decay_t<decltype(member)>>(value, field.index);
    });
  });
  return h;
}

template <class Hyper, class Options>
void SetTorchOptions(const Hyper& h, Options& o) {
  algos::ForEachField<algos::DescriptorOf<Hyper>>([&](const auto& field) {
    WithTorchOption(o, field.GroupKey(), [&](const auto& value, const auto& set) {
      set(WithField(std::decay_t<decltype(value)>(value), field.index, h.*field.member));
    });
  });
}

struct SgdTraits {
  using Options = torch::optim::SGDOptions;
  using State = torch::optim::SGDParamState;
  using Hyper = SgdHyper;
  using StateWithAbsmax = SgdParamState;  // for 8-bit states and stochastic rounding's count
  using Twin = torch::optim::SGD;
  using Class = Twin;
  static constexpr bool kTakesSparse = true;
  static constexpr const char* kName = "fusedopt::pt::SGD";

  static Hyper ToHyper(const Options& o) { return HyperOfTorchOptions<Hyper>(o); }
  static void FromHyper(const Hyper& h, Options& o) { SetTorchOptions(h, o); }
  static StateSlots Slots(State& s) { return {&s.momentum_buffer(), nullptr, nullptr}; }
  // SGD keeps no step count: torch starts the momentum buffer as a copy of the update direction
  // when it has none, which the core does for step 1.
  static std::int64_t NextStep(const State& s) { return s.momentum_buffer().defined() ? 2 : 1; }
  static void SetStep(State& /*s*/, std::int64_t /*step*/) {}
  // The count stochastic rounding keys its noise by, where the state has room for it.
  static std::int64_t RoundingStep(const State& s) {
    const auto* counted = dynamic_cast<const SgdParamState*>(&s);
    return counted != nullptr ? counted->rounding_step() : 0;
  }
  static void SetRoundingStep(State& s, std::int64_t count) {
    if (auto* counted = dynamic_cast<SgdParamState*>(&s)) counted->rounding_step(count);
  }
};

// Adam and AdamW share state slots and step count; only options and hyper differ.
template <class OptionsT, class StateT, class HyperT>
struct AdamFamilyTraits {
  using Options = OptionsT;
  using State = StateT;
  using Hyper = HyperT;
  using StateWithAbsmax = ParamStateWithAbsmax<State, Hyper>;  // for 8-bit states

  static Hyper ToHyper(const Options& o) { return HyperOfTorchOptions<Hyper>(o); }
  static void FromHyper(const Hyper& h, Options& o) { SetTorchOptions(h, o); }
  static StateSlots Slots(State& s) { return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

struct AdamTraits
    : AdamFamilyTraits<torch::optim::AdamOptions, torch::optim::AdamParamState, AdamHyper> {
  using Twin = torch::optim::Adam;
  using Class = Twin;
  static constexpr bool kTakesSparse = false;
  static constexpr const char* kName = "fusedopt::pt::Adam";
};

struct AdamWTraits
    : AdamFamilyTraits<torch::optim::AdamWOptions, torch::optim::AdamWParamState, AdamWHyper> {
  using Twin = torch::optim::AdamW;
  using Class = Twin;
  static constexpr bool kTakesSparse = false;
  static constexpr const char* kName = "fusedopt::pt::AdamW";
};

struct RmspropTraits {
  using Options = torch::optim::RMSpropOptions;
  using State = torch::optim::RMSpropParamState;
  using Hyper = RmspropHyper;
  using StateWithAbsmax = ParamStateWithAbsmax<State, Hyper>;  // for 8-bit states
  using Twin = torch::optim::RMSprop;
  using Class = Twin;
  static constexpr bool kTakesSparse = false;
  static constexpr const char* kName = "fusedopt::pt::RMSprop";

  static Hyper ToHyper(const Options& o) { return HyperOfTorchOptions<Hyper>(o); }
  static void FromHyper(const Hyper& h, Options& o) { SetTorchOptions(h, o); }
  static StateSlots Slots(State& s) {
    return {&s.square_avg(), &s.momentum_buffer(), &s.grad_avg()};
  }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

struct AdagradTraits {
  using Options = torch::optim::AdagradOptions;
  using State = torch::optim::AdagradParamState;
  using Hyper = AdagradHyper;
  using StateWithAbsmax = ParamStateWithAbsmax<State, Hyper>;  // for 8-bit states
  using Twin = torch::optim::Adagrad;
  using Class = Twin;
  static constexpr bool kTakesSparse = true;
  static constexpr const char* kName = "fusedopt::pt::Adagrad";

  static Hyper ToHyper(const Options& o) { return HyperOfTorchOptions<Hyper>(o); }
  static void FromHyper(const Hyper& h, Options& o) { SetTorchOptions(h, o); }
  static StateSlots Slots(State& s) { return {&s.sum(), nullptr, nullptr}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// `where`: "" for the defaults, " of param_groups[g]" for a group's options.
inline void CheckLambMaxGradNorm(double max_grad_norm, const std::string& where) {
  TORCH_CHECK(max_grad_norm >= 0.0, "fusedopt::pt::LAMB: Invalid max_grad_norm value", where, ": ",
              max_grad_norm, " (must be >= 0; inf: no clipping)");
}

// An algorithm whose reference clips every gradient by a max_grad_norm of its options (LAMB:
// ExtraOptions, optim.h) in place of training()'s torch-rule clipping.
template <class Hyper>
concept ClipsGlobally = requires(const ExtraOptions<Hyper>& e) {
  e.max_grad_norm;
};

// "fusedopt::pt::NAdam": the class name its reference gives the algorithm (the descriptor's).
template <class Hyper>
std::string GenericName() {
  return "fusedopt::pt::" + std::string(algos::DescriptorOf<Hyper>::kTorchName);
}

template <class H>
struct GenericTraits {
  using Class = FusedOptimizer<H>;
  using Options = HyperOptions<H>;
  using State = HyperParamState<H>;
  using Hyper = H;
  using StateWithAbsmax = State;  // a HyperParamState has it
  static inline const std::string kName = GenericName<H>();
  // LAMB's as its users have written it since it was a class of its own (LAMBOptions is an alias).
  static inline const std::string kOptionsName =
      std::is_same_v<H, LambHyper> ? "fusedopt::pt::LambOptions" : kName + "Options";

  // Whether torch's state of the algorithm has a step count (all but Lion and LARS here).
  static constexpr bool kCountsSteps = algos::CountsSteps<algos::DescriptorOf<H>>();

  static Hyper ToHyper(const Options& o) { return o.hyper(); }
  static void FromHyper(const Hyper& h, Options& o) { o.hyper() = h; }
  static StateSlots Slots(State& s) {
    StateSlots slots{};
    for (int k = 0; k < kMaxStates; ++k) slots[k] = &s.tensors[k];
    return slots;
  }
  static std::array<at::Tensor*, kMaxScalars> Scalars(State& s) {
    std::array<at::Tensor*, kMaxScalars> scalars{};
    for (int k = 0; k < kMaxScalars; ++k) scalars[k] = &s.scalars[k];
    return scalars;
  }
  // An algorithm without torch's state['step'] (Lion, LARS) reads only whether its first state is
  // new, as SGD does (LARS's momentum buffer), so a state loaded without a count continues; its
  // count keys stochastic rounding's noise (RoundingStep).
  static std::int64_t NextStep(const State& s) {
    if constexpr (kCountsSteps) {
      return s.step() + 1;
    } else {
      return s.tensors[0].defined() ? 2 : 1;
    }
  }
  static void SetStep(State& s, std::int64_t step) {
    if constexpr (kCountsSteps) s.step(step);
  }
  static std::int64_t RoundingStep(const State& s) requires(!kCountsSteps) { return s.step(); }
  static void SetRoundingStep(State& s, std::int64_t count) requires(!kCountsSteps) {
    s.step(count);
  }

  // apex FusedLAMB's global clipping: the groups' max_grad_norm (one value) with ClipRule::kLamb,
  // in place of training()'s torch-rule clipping.
  static PrePassOptions Clipping(const torch::optim::Optimizer& optimizer,
                                 const TrainingOptions& training) requires ClipsGlobally<H> {
    TORCH_CHECK(training.max_grad_norm == kInf, kName, ": training().max_grad_norm is ",
                training.max_grad_norm,
                ", but LAMB clips with LambOptions::max_grad_norm (apex FusedLAMB's rule): leave "
                "training().max_grad_norm at inf");
    TORCH_CHECK(training.norm_type == NormType::kL2, kName,
                ": training().norm_type must be kL2 (LAMB's max_grad_norm clips the L2 norm)");
    std::optional<double> max_norm;
    std::size_t first = 0;
    const auto& groups = optimizer.param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto* o = dynamic_cast<const Options*>(&groups[g].options());
      if (o == nullptr) continue;  // the step reports it
      CheckLambMaxGradNorm(o->max_grad_norm(), " of param_groups[" + std::to_string(g) + "]");
      if (!max_norm.has_value()) {
        max_norm = o->max_grad_norm();
        first = g;
      }
      TORCH_CHECK(o->max_grad_norm() == *max_norm, kName,
                  ": max_grad_norm is one threshold for all gradients, but param_groups[", first,
                  "] has ", *max_norm, " and param_groups[", g, "] has ", o->max_grad_norm());
    }
    return {.max_norm = max_norm.value_or(kInf),
            .norm_type = NormType::kL2,
            .clip_rule = ClipRule::kLamb};
  }
};

// The Traits of the algorithm of Hyper: its class's (optim.h's ClassOf).
template <class Hyper>
struct TraitsOfT {
  using type = GenericTraits<Hyper>;
};
template <>
struct TraitsOfT<SgdHyper> {
  using type = SgdTraits;
};
template <>
struct TraitsOfT<AdamHyper> {
  using type = AdamTraits;
};
template <>
struct TraitsOfT<AdamWHyper> {
  using type = AdamWTraits;
};
template <>
struct TraitsOfT<RmspropHyper> {
  using type = RmspropTraits;
};
template <>
struct TraitsOfT<AdagradHyper> {
  using type = AdagradTraits;
};
template <class Hyper>
using TraitsOf = typename TraitsOfT<Hyper>::type;

}  // namespace fusedopt::pt::detail
