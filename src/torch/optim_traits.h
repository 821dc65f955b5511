// How each fusedopt::pt optimizer maps its options and param state onto the core's hyper struct
// and Segment::state slots (fused_step.h says what a Traits struct holds): torch::optim's classes
// for SGD, Adam, AdamW, RMSprop and Adagrad, ours for Lion and LAMB, and the generic HyperOptions /
// HyperParamState for the others. The step (optim.cc) and checkpoints (checkpoint.cc) read them;
// FromHyper is ToHyper's inverse for the fields the options have.
#pragma once

#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "fusedopt/hyper.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "src/torch/fused_step.h"

namespace fusedopt::pt::detail {

using StateSlots = std::array<at::Tensor*, kMaxStates>;

struct SgdTraits {
  using Options = torch::optim::SGDOptions;
  using State = torch::optim::SGDParamState;
  using Hyper = SgdHyper;
  using Twin = torch::optim::SGD;
  static constexpr bool kTakesSparse = true;
  static constexpr const char* kName = "fusedopt::pt::SGD";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .momentum = o.momentum(),
            .dampening = o.dampening(),
            .weight_decay = o.weight_decay(),
            .nesterov = o.nesterov()};
  }
  static void FromHyper(const Hyper& h, Options& o) {
    o.lr(h.lr).momentum(h.momentum).dampening(h.dampening).weight_decay(h.weight_decay);
    o.nesterov(h.nesterov);
  }
  static StateSlots Slots(State& s) { return {&s.momentum_buffer(), nullptr, nullptr}; }
  // SGD keeps no step count: torch starts the momentum buffer as a copy of the update direction
  // when it has none, which the core does for step 1.
  static std::int64_t NextStep(const State& s) { return s.momentum_buffer().defined() ? 2 : 1; }
  static void SetStep(State& /*s*/, std::int64_t /*step*/) {}
};

// Adam and AdamW share state slots and step count; only options and hyper differ.
template <class OptionsT, class StateT, class HyperT>
struct AdamFamilyTraits {
  using Options = OptionsT;
  using State = StateT;
  using Hyper = HyperT;

  static Hyper ToHyper(const Options& o) {
    Hyper h;
    h.lr = o.lr();
    h.beta1 = std::get<0>(o.betas());
    h.beta2 = std::get<1>(o.betas());
    h.eps = o.eps();
    h.weight_decay = o.weight_decay();
    h.amsgrad = o.amsgrad();
    return h;
  }
  static void FromHyper(const Hyper& h, Options& o) {
    o.lr(h.lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(h.weight_decay);
    o.amsgrad(h.amsgrad);
  }
  static StateSlots Slots(State& s) { return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

struct AdamTraits
    : AdamFamilyTraits<torch::optim::AdamOptions, torch::optim::AdamParamState, AdamHyper> {
  using Twin = torch::optim::Adam;
  static constexpr bool kTakesSparse = false;
  static constexpr const char* kName = "fusedopt::pt::Adam";
};

struct AdamWTraits
    : AdamFamilyTraits<torch::optim::AdamWOptions, torch::optim::AdamWParamState, AdamWHyper> {
  using Twin = torch::optim::AdamW;
  static constexpr bool kTakesSparse = false;
  static constexpr const char* kName = "fusedopt::pt::AdamW";
};

struct RmspropTraits {
  using Options = torch::optim::RMSpropOptions;
  using State = torch::optim::RMSpropParamState;
  using Hyper = RmspropHyper;
  using Twin = torch::optim::RMSprop;
  static constexpr bool kTakesSparse = false;
  static constexpr const char* kName = "fusedopt::pt::RMSprop";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .alpha = o.alpha(),
            .eps = o.eps(),
            .weight_decay = o.weight_decay(),
            .momentum = o.momentum(),
            .centered = o.centered()};
  }
  static void FromHyper(const Hyper& h, Options& o) {
    o.lr(h.lr).alpha(h.alpha).eps(h.eps).weight_decay(h.weight_decay).momentum(h.momentum);
    o.centered(h.centered);
  }
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
  using Twin = torch::optim::Adagrad;
  static constexpr bool kTakesSparse = true;
  static constexpr const char* kName = "fusedopt::pt::Adagrad";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .lr_decay = o.lr_decay(),
            .weight_decay = o.weight_decay(),
            .initial_accumulator_value = o.initial_accumulator_value(),
            .eps = o.eps()};
  }
  static void FromHyper(const Hyper& h, Options& o) {
    o.lr(h.lr).lr_decay(h.lr_decay).weight_decay(h.weight_decay);
    o.initial_accumulator_value(h.initial_accumulator_value).eps(h.eps);
  }
  static StateSlots Slots(State& s) { return {&s.sum(), nullptr, nullptr}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

struct LionTraits {
  using Options = LionOptions;
  using State = LionParamState;
  using Hyper = LionHyper;
  static constexpr const char* kName = "fusedopt::pt::Lion";
  static constexpr const char* kOptionsName = "fusedopt::pt::LionOptions";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .beta1 = std::get<0>(o.betas()),
            .beta2 = std::get<1>(o.betas()),
            .weight_decay = o.weight_decay()};
  }
  static void FromHyper(const Hyper& h, Options& o) {
    o.lr(h.lr).betas({h.beta1, h.beta2}).weight_decay(h.weight_decay);
  }
  static StateSlots Slots(State& s) { return {&s.exp_avg(), nullptr, nullptr}; }
  // lion-pytorch keeps no step count and Lion's update reads none; as the Python class, 1 for a
  // new exp_avg and 2 after.
  static std::int64_t NextStep(const State& s) { return s.exp_avg().defined() ? 2 : 1; }
  static void SetStep(State& /*s*/, std::int64_t /*step*/) {}
};

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// `where`: "" for the defaults, " of param_groups[g]" for a group's options.
inline void CheckLambMaxGradNorm(double max_grad_norm, const std::string& where) {
  TORCH_CHECK(max_grad_norm >= 0.0, "fusedopt::pt::LAMB: Invalid max_grad_norm value", where, ": ",
              max_grad_norm, " (must be >= 0; inf: no clipping)");
}

struct LambTraits {
  using Options = LambOptions;
  using State = LambParamState;
  using Hyper = LambHyper;
  static constexpr const char* kName = "fusedopt::pt::LAMB";
  static constexpr const char* kOptionsName = "fusedopt::pt::LambOptions";

  static Hyper ToHyper(const Options& o) {
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
  static void FromHyper(const Hyper& h, Options& o) {
    o.lr(h.lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(h.weight_decay);
    o.bias_correction(h.bias_correction).adam_w_mode(h.adam_w_mode);
    o.grad_averaging(h.grad_averaging).use_nvlamb(h.use_nvlamb);
  }
  static StateSlots Slots(State& s) { return {&s.exp_avg(), &s.exp_avg_sq(), nullptr}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }

  // apex FusedLAMB's global clipping: the groups' max_grad_norm (one value) with ClipRule::kLamb,
  // in place of training()'s torch-rule clipping.
  static PrePassOptions Clipping(const torch::optim::Optimizer& optimizer,
                                 const TrainingOptions& training) {
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

// "fusedopt::pt::Adamax": torch.optim's class name (the descriptor's step name without "Step",
// spelled as torch spells it).
template <class Hyper>
std::string GenericName() {
  using D = algos::DescriptorOf<Hyper>;
  static constexpr std::pair<std::string_view, std::string_view> kTorchSpelling[] = {
      {"sgd", "SGD"},     {"rmsprop", "RMSprop"},     {"lamb", "LAMB"},
      {"radam", "RAdam"}, {"nadam", "NAdam"},         {"asgd", "ASGD"},
      {"lars", "LARS"},   {"rmsproptf", "RMSpropTF"}, {"adamp", "AdamP"}};
  for (const auto& [engine, torch_name] : kTorchSpelling) {
    if (D::kName == engine) return "fusedopt::pt::" + std::string(torch_name);
  }
  const std::string_view step = D::kStepName;
  return "fusedopt::pt::" + std::string(step.substr(0, step.size() - 4));
}

template <class H>
struct GenericTraits {
  using Options = HyperOptions<H>;
  using State = HyperParamState<H>;
  using Hyper = H;
  static inline const std::string kName = GenericName<H>();
  static inline const std::string kOptionsName = kName + "Options";

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
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

}  // namespace fusedopt::pt::detail
