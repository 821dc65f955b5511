// The five fusedopt::pt optimizers: how each maps torch::optim's options and param state onto the
// core's hyper struct and Segment::state slots (the loop itself is fused_step.h; state keys and
// initial values come from the algorithm's descriptor, src/algos/).

#include "fusedopt/pt/optim.h"

#include <array>
#include <cstdint>
#include <span>
#include <tuple>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/torch/fused_step.h"

namespace fusedopt::pt {
namespace {

using StateSlots = std::array<at::Tensor*, kMaxStates>;

struct SgdTraits {
  using Options = torch::optim::SGDOptions;
  using State = torch::optim::SGDParamState;
  using Hyper = SgdHyper;
  static constexpr const char* kName = "fusedopt::pt::SGD";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .momentum = o.momentum(),
            .dampening = o.dampening(),
            .weight_decay = o.weight_decay(),
            .nesterov = o.nesterov()};
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
  static StateSlots Slots(State& s) { return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

struct AdamTraits
    : AdamFamilyTraits<torch::optim::AdamOptions, torch::optim::AdamParamState, AdamHyper> {
  static constexpr const char* kName = "fusedopt::pt::Adam";
};

struct AdamWTraits
    : AdamFamilyTraits<torch::optim::AdamWOptions, torch::optim::AdamWParamState, AdamWHyper> {
  static constexpr const char* kName = "fusedopt::pt::AdamW";
};

struct RmspropTraits {
  using Options = torch::optim::RMSpropOptions;
  using State = torch::optim::RMSpropParamState;
  using Hyper = RmspropHyper;
  static constexpr const char* kName = "fusedopt::pt::RMSprop";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .alpha = o.alpha(),
            .eps = o.eps(),
            .weight_decay = o.weight_decay(),
            .momentum = o.momentum(),
            .centered = o.centered()};
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
  static constexpr const char* kName = "fusedopt::pt::Adagrad";

  static Hyper ToHyper(const Options& o) {
    return {.lr = o.lr(),
            .lr_decay = o.lr_decay(),
            .weight_decay = o.weight_decay(),
            .initial_accumulator_value = o.initial_accumulator_value(),
            .eps = o.eps()};
  }
  static StateSlots Slots(State& s) { return {&s.sum(), nullptr, nullptr}; }
  static std::int64_t NextStep(const State& s) { return s.step() + 1; }
  static void SetStep(State& s, std::int64_t step) { s.step(step); }
};

}  // namespace

torch::Tensor SGD::step(LossClosure closure) {
  return detail::FusedStep<SgdTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor Adam::step(LossClosure closure) {
  return detail::FusedStep<AdamTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor AdamW::step(LossClosure closure) {
  return detail::FusedStep<AdamWTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor RMSprop::step(LossClosure closure) {
  return detail::FusedStep<RmspropTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor Adagrad::step(LossClosure closure) {
  return detail::FusedStep<AdagradTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}

}  // namespace fusedopt::pt
