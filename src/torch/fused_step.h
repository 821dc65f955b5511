// The step shared by the fusedopt::pt optimizers: gather every param with a defined grad,
// over all param groups, into fusedopt::Segments and run the core's TrainingStep once.
//
// An optimizer plugs in through a Traits struct (optim.cc):
//   Options, State, Hyper        the options and param-state classes (torch's, or the generic
//                                HyperOptions / HyperParamState), the core's hyper struct
//   StateWithAbsmax              the State that can hold 8-bit states' absmax (StateAbsmax)
//   Class                        the optimizer class the Traits read (checkpoint.cc's dynamic_cast)
//   kName                        "fusedopt::pt::Adam", for messages
//   ToHyper(options)             one Hyper per param group, re-read on every step (schedulers edit
//                                the options in place)
//   Slots(state)[slot]           the State member holding that slot's tensor
//   NextStep(state)              Segment::step: the step being taken (torch's state step + 1);
//                                for an algorithm without a count, 1 while its first state is
//                                new, else 2
//   SetStep(state, step)         stores it after a successful step (nothing without a count)
//   RoundingStep(state)          optional, for an algorithm without torch's count (SGD, Lion,
//                                LARS): the steps counted for stochastic rounding's noise
//                                (Segment::rounding_step is one more), 0 where none is kept
//   SetRoundingStep(state, n)    stores that count (after a step; from a checkpoint)
//   Scalars(state)[k]            for an algorithm with scalar states (NAdam's mu_product): the
//                                State member holding scalar state k, a 0-d float32 tensor
//   Clipping(optimizer, training) optional: the pre-pass's clipping (threshold, norm, ClipRule)
//                                when the algorithm has its own (LAMB's max_grad_norm); without
//                                it, training's max_grad_norm and norm_type with ClipRule::kTorch
//   Twin, kTakesSparse           optional: the torch::optim class whose own step takes the params
//                                the engine cannot (RouteReason), unless training.strict, and
//                                whether that step takes sparse grads
// The state keys of the slots and the values new state tensors start from are the descriptor's
// (src/algos/<algo>.h), as is the step that TrainingStep runs. A factored algorithm (Adafactor)
// takes Segment::rows and cols from a param's last two dimensions and creates and checks only the
// slots its SegmentStates names for that shape, its factors shaped as torch's (FactorShape).
//
// Nothing is changed unless the whole step succeeds: new states, new state tensors and state
// tensors converted to the param's dtype are kept aside and committed, with the step counts, only
// after the core returns (the core itself writes no buffer when it rejects a call). A failed check
// leaves params, state() and step counts as they were, as torch's own checks do.
//
// TrainingOptions (optim.h) go to the core's TrainingStep (fusedopt/training_step.h) as
// fusedopt::Optimizer::Step passes StepOptions: with a scaler every segment's grad_scale is
// scaler->inv_scale(); with a scaler or a finite max_grad_norm (LAMB: its options', apex's rule)
// the pre-pass reads the gradients (non-finite flag, global norm, clip coefficient folded into
// grad_scale). A non-finite gradient skips the step before the commit (nothing changed) and calls
// scaler->Update(true); a successful step is followed by scaler->Update(false). A step that throws
// leaves the scaler as it was.
//
// With TrainingOptions::accumulation_steps > 1 the call is one micro-batch (MicroBatch): its
// gradients go into f32 sums kept in the optimizer (detail::Accumulation), and only the window's
// last call has segments, every param of the window reading its sum (grad_scale 1: the sums hold
// the scaler's factor). The window, the new sums and which params they hold are committed after the
// core returns.
#pragma once

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/pt/optim.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"
#include "src/torch/tensor_checks.h"

namespace fusedopt::pt::detail {

// Twin's own step (not the override) over `routed` only, each param's grad replaced by
// grad_of(p) where that is defined: each group's params are swapped with its routed ones, and
// their grads with the replacements, for the call, and back, whatever the step does.
template <class Twin, class GradOf>
void TwinStep(torch::optim::Optimizer& optimizer, std::vector<std::vector<at::Tensor>>& routed,
              const GradOf& grad_of) {
  auto& groups = optimizer.param_groups();
  std::vector<std::pair<at::Tensor, at::Tensor>> own_grads;  // (param, its grad)
  const auto swap = [&] {
    for (std::size_t g = 0; g < groups.size(); ++g) std::swap(groups[g].params(), routed[g]);
    for (auto& [p, grad] : own_grads) std::swap(p.mutable_grad(), grad);
  };
  for (const auto& group : routed) {
    for (const at::Tensor& p : group) {
      at::Tensor grad = grad_of(p);
      if (grad.defined()) own_grads.emplace_back(p, std::move(grad));
    }
  }
  swap();
  struct SwapBack {
    decltype(swap)& undo;
    ~SwapBack() { undo(); }
  } swap_back{swap};
  auto& twin = dynamic_cast<Twin&>(optimizer);
  twin.Twin::step(nullptr);
}

// The pre-pass of a step with routed params, over the fused params' grads and the routed ones: the
// global norm of the unscaled gradients, in double (torch sums clip_grad_norm_ in the gradients'
// dtype, so its norm can differ in the last bits). Returns false when a gradient is not finite
// (the step is skipped: `result` says so); otherwise sets result's grad_norm (with clipping) and
// clip_coef.
inline bool MixedPrePass(std::span<const at::Tensor> fused_grads,
                         const std::vector<std::vector<at::Tensor>>& routed,
                         const PrePassOptions& clipping, float grad_scale, StepResult& result) {
  const bool clip = clipping.max_norm != std::numeric_limits<double>::infinity();
  if (!clip && grad_scale == 1.0f) return true;  // no scaler, no clipping: nothing spans
  const double order = clipping.norm_type == NormType::kL1    ? 1.0
                       : clipping.norm_type == NormType::kInf ? INFINITY
                                                              : 2.0;
  std::vector<at::Tensor> norms;
  const auto add = [&](const at::Tensor& g) {
    const at::Tensor dense = g.is_sparse() ? g.coalesce().values() : g;
    norms.push_back(at::linalg_vector_norm(dense, order, {}, false,
                                           dense.is_complex() ? at::kComplexDouble : at::kDouble)
                        .cpu());
  };
  for (const at::Tensor& g : fused_grads) add(g);
  for (const auto& group : routed) {
    for (const at::Tensor& p : group) add(p.grad());
  }
  const double norm = at::linalg_vector_norm(at::stack(norms), order).item<double>() * grad_scale;
  if (clip) result.grad_norm = norm;
  if (!std::isfinite(norm)) {
    result.found_inf = true;
    return false;
  }
  if (clip) {
    result.clip_coef = clipping.clip_rule == ClipRule::kLamb
                           ? LambClipCoefficient(norm, clipping.max_norm)
                           : ClipCoefficient(norm, clipping.max_norm);
  }
  return true;
}

// The shape of state slot `slot` of p where it is not p's own: a factored algorithm's factors, as
// torch.optim.Adafactor's _init_group makes them, row_var p.shape[:-1] + (1,) and col_var
// p.shape[:-2] + (1, p.shape[-1]) (kept in the param's dtype, as every state here). nullopt for
// p's shape.
template <class Descriptor>
std::optional<std::vector<std::int64_t>> FactorShape(const at::Tensor& p, int slot) {
  if constexpr (algos::Factored<Descriptor>) {
    if (p.dim() > 1 && (slot == kAdafactorRowVar || slot == kAdafactorColVar)) {
      std::vector<std::int64_t> shape(p.sizes().begin(), p.sizes().end());
      shape[shape.size() - (slot == kAdafactorRowVar ? 1 : 2)] = 1;
      return shape;
    }
  }
  return std::nullopt;
}

template <class Traits>
at::Tensor FusedStep(torch::optim::Optimizer& optimizer,
                     const torch::optim::Optimizer::LossClosure& closure,
                     const TrainingOptions& training, StepResult& result,
                     std::optional<FusedStepOptions::Interval>& pre_pass,
                     Accumulation& accumulation) {
  using State = typename Traits::State;
  using Options = typename Traits::Options;
  using Hyper = typename Traits::Hyper;
  using Descriptor = algos::DescriptorOf<Hyper>;

  // As torch::optim: the closure runs with grad mode on, the update without.
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  result = StepResult{};
  pre_pass.reset();
  TORCH_CHECK(training.max_grad_norm >= 0.0, Traits::kName, ": invalid max_grad_norm ",
              training.max_grad_norm, " (must be >= 0; inf: no clipping)");
  LossScaler* const scaler = training.scaler;
  const float grad_scale = scaler != nullptr ? scaler->inv_scale() : 1.0f;
  // The accumulation window, committed after the call: with accumulation_steps > 1 each step()
  // adds its gradients into the f32 sums (MicroBatch) and only the window's last one steps, every
  // param of the window reading its sum.
  TORCH_CHECK(training.accumulation_steps >= 1, Traits::kName, ": invalid accumulation_steps ",
              training.accumulation_steps, " (must be >= 1)");
  AccumulationWindow window = accumulation.window;
  TORCH_CHECK(window.pending == 0 || window.steps == training.accumulation_steps, Traits::kName,
              ": training().accumulation_steps changed from ", window.steps, " to ",
              training.accumulation_steps, " inside a window (", window.pending,
              " micro-batches added); change it between windows");
  window.steps = training.accumulation_steps;
  const bool accumulating = window.steps > 1;
  if (!accumulating) accumulation.sums.clear();  // (between windows: they hold nothing of use)
  const bool closes = !accumulating || window.pending + 1 == window.steps;
  std::vector<GradBuffer> batch_grads;   // this micro-batch's gradients
  std::vector<float*> batch_sums;        // the sum of each
  std::vector<std::uint8_t> fresh;       // whether that sum starts in this window
  std::vector<at::Tensor> batch_keep;    // contiguous copies of grads, alive during the call
  std::vector<at::Tensor> batch_params;  // the params of the micro-batch
  std::vector<ParamName> batch_names;
  std::vector<std::pair<const void*, at::Tensor>> new_sums;  // committed after the call
  PrePassOptions clipping{.max_norm = training.max_grad_norm, .norm_type = training.norm_type};
  if constexpr (requires { Traits::Clipping(optimizer, training); }) {
    clipping = Traits::Clipping(optimizer, training);
  }

  std::vector<Hyper> hypers;
  std::vector<Segment> segments;
  std::vector<at::Tensor> params;  // stepped params, in segment order
  std::vector<ParamName> names;    // their names, for messages
  std::vector<State*> states;      // their states (null where the algorithm keeps none)
  std::vector<at::Tensor> grads;   // keeps contiguous copies of grads alive during the step
  std::vector<std::pair<void*, std::unique_ptr<State>>> new_states;  // committed after the step
  // New or converted state tensors, and the State members they go to; likewise committed after.
  std::vector<std::pair<at::Tensor*, at::Tensor>> new_tensors;

  auto& groups = optimizer.param_groups();
  auto& state_map = optimizer.state();
  std::vector<std::vector<at::Tensor>> routed(groups.size());  // for the twin's step, per group
  std::string routed_why;
  hypers.reserve(groups.size());
  CheckStateDType(Traits::kName, training.state_dtype, algos::QuantizableStates<Descriptor>);
  // An algorithm without torch's step count keeps one for the noise (Segment::rounding_step).
  constexpr bool kRoundingCount = requires(const State& s) { Traits::RoundingStep(s); };
  const bool counts_rounding = kRoundingCount && training.stochastic_rounding;
  // Each param's first element in all groups' params laid end to end (with or without a grad, a
  // param listed twice at its first place): the index that keys stochastic rounding's noise, as
  // the Python classes count it (_global_offset).
  std::unordered_map<const void*, std::uint64_t> offsets;
  if (training.stochastic_rounding) {
    std::uint64_t total = 0;
    for (const auto& group : groups) {
      for (const at::Tensor& p : group.params()) {
        offsets.try_emplace(p.unsafeGetTensorImpl(), total);
        total += static_cast<std::uint64_t>(p.numel());
      }
    }
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto* options = dynamic_cast<const Options*>(&groups[g].options());
    TORCH_CHECK(options != nullptr, Traits::kName, ": param_groups[", g,
                "] has the options of another optimizer");
    hypers.push_back(Traits::ToHyper(*options));
    const Hyper& hyper = hypers.back();
    const unsigned required = RequiredStates(hyper);

    const std::vector<at::Tensor>& group_params = groups[g].params();
    for (std::size_t i = 0; i < group_params.size(); ++i) {
      const at::Tensor& p = group_params[i];
      const bool has_grad = p.grad().defined();
      // With accumulation, a param whose sum holds gradients of this window is stepped from it by
      // the window's last call, with or without a gradient in that micro-batch.
      const void* const key = p.unsafeGetTensorImpl();
      Accumulation::Sum* held_sum = nullptr;
      if (accumulating) {
        const auto it = accumulation.sums.find(key);
        if (it != accumulation.sums.end() && it->second.sum.sizes() == p.sizes()) {
          held_sum = &it->second;
        }
      }
      const bool in_window = held_sum != nullptr && held_sum->in_window;
      // torch skips params without a grad: no state, no step count
      if (!has_grad && !(closes && in_window)) continue;
      const ParamName name{g, i};
      if constexpr (requires { typename Traits::Twin; }) {
        if (!training.strict && has_grad) {
          const std::string why = RouteReason(p, Traits::kTakesSparse);
          if (!why.empty()) {
            routed[g].push_back(p);
            routed_why += (routed_why.empty() ? "" : "; ") + ToString(name) + ": " + why;
            continue;
          }
        }
      }
      CheckParam(Traits::kName, name, p);
      if constexpr (algos::Factored<Descriptor>) {
        // torch.optim.Adafactor's alpha divides by numel ** 0.5 (a ZeroDivisionError in torch).
        TORCH_CHECK(p.numel() > 0, Traits::kName, ": ", ToString(name), " has no elements (shape ",
                    p.sizes(), "); torch.optim.Adafactor's step divides by a param's numel");
      }
      if (!accumulating) {
        grads.push_back(CheckedGrad(Traits::kName, name, p));
      } else {
        if (has_grad) {
          const at::Tensor& grad = batch_keep.emplace_back(CheckedGrad(Traits::kName, name, p));
          at::Tensor sum = held_sum != nullptr ? held_sum->sum : at::Tensor();
          if (!sum.defined()) {
            sum = at::empty(p.sizes(), p.options().dtype(at::kFloat));
            new_sums.emplace_back(key, sum);
          }
          batch_grads.push_back({const_cast<void*>(grad.const_data_ptr()),
                                 static_cast<std::size_t>(grad.numel()), ToDType(grad)});
          batch_sums.push_back(sum.data_ptr<float>());
          fresh.push_back(in_window ? 0 : 1);
          batch_params.push_back(p);
          batch_names.push_back(name);
          if (!closes) continue;
          grads.push_back(sum);
        } else {
          grads.push_back(held_sum->sum);
        }
      }

      Segment seg;
      seg.param = p.data_ptr();
      seg.grad = grads.back().const_data_ptr();
      seg.numel = static_cast<std::size_t>(p.numel());
      if constexpr (algos::Factored<Descriptor>) {
        // Adafactor's matrices: the last two dimensions of a param of more than one (the leading
        // ones a batch, row-major as the contiguity check ensures); a vector has neither.
        seg.rows = p.dim() > 1 ? static_cast<std::size_t>(p.size(-2)) : 0;
        seg.cols = p.dim() > 1 ? static_cast<std::size_t>(p.size(-1)) : 0;
      } else {
        // AdamP's channel rows: size(0) of a param of more than one dimension (contiguous, as
        // checked); the algorithms without per-row sums ignore it.
        seg.rows = p.dim() > 1 ? static_cast<std::size_t>(p.size(0)) : 0;
      }
      seg.param_dtype = ToDType(p);
      seg.grad_dtype = ToDType(grads.back());
      const at::ScalarType state_dtype =
          StateDTypeOf(training.state_dtype, training.min_8bit_size, p);
      seg.state_dtype = ToDType(state_dtype);
      seg.group = static_cast<std::uint32_t>(g);
      seg.grad_scale = accumulating ? 1.0f : grad_scale;  // (the sums hold it)
      if (training.stochastic_rounding) {
        seg.stochastic_rounding = true;
        seg.rounding_seed = training.rounding_seed;
        seg.global_offset = offsets.at(p.unsafeGetTensorImpl());
      }

      State* state = nullptr;
      if (required != 0 || counts_rounding) {
        auto it = state_map.find(p.unsafeGetTensorImpl());
        if (it != state_map.end() && it->second != nullptr) {
          state = dynamic_cast<State*>(it->second.get());
          TORCH_CHECK(state != nullptr, Traits::kName, ": the state of ", ToString(name),
                      " belongs to another optimizer type");
        } else {
          new_states.emplace_back(p.unsafeGetTensorImpl(), std::make_unique<State>());
          state = new_states.back().second.get();
        }
        // torch::optim's own param states (created by the twin's step or constructor) have no
        // room for an absmax or SGD's count: one whose states become 8-bit, or that needs the
        // count, is replaced by a copy that has.
        auto* absmax = dynamic_cast<StateAbsmax*>(state);
        if (absmax == nullptr && (state_dtype == at::kByte || counts_rounding)) {
          auto upgraded = std::make_unique<typename Traits::StateWithAbsmax>(*state);
          absmax = upgraded.get();
          state = upgraded.get();
          new_states.emplace_back(p.unsafeGetTensorImpl(), std::move(upgraded));
        }
        seg.step = Traits::NextStep(*state);
        if constexpr (kRoundingCount) seg.rounding_step = Traits::RoundingStep(*state) + 1;
        // A factored algorithm needs, of the slots its hyper-parameters may use, those of this
        // param's shape (Adafactor: row_var and col_var, or variance); the others stay as they are.
        unsigned needed = required;
        if constexpr (algos::Factored<Descriptor>) needed &= Descriptor::SegmentStates(seg);
        const auto slots = Traits::Slots(*state);
        for (int slot = 0; slot < kMaxStates; ++slot) {
          if ((needed >> slot & 1u) == 0) continue;
          at::Tensor& held = *slots[slot];
          const std::optional<std::vector<std::int64_t>> shape = FactorShape<Descriptor>(p, slot);
          if (shape) {  // never 8-bit (CheckStateDType)
            at::Tensor ready =
                held.defined() ? CheckedShapedState(Traits::kName, name, Descriptor::kStates[slot],
                                                    p, held, *shape, state_dtype)
                               : at::full(*shape, Descriptor::InitialState(hyper, slot),
                                          p.options().dtype(state_dtype));
            seg.state[slot] = ready.data_ptr();
            if (!ready.is_same(held)) new_tensors.emplace_back(&held, std::move(ready));
            continue;
          }
          const QuantMap map = SlotMap(algos::UnsignedMapStates<Descriptor>(), slot);
          at::Tensor no_absmax;
          at::Tensor& held_absmax = absmax != nullptr ? absmax->absmax[slot] : no_absmax;
          StateBuffers ready =
              held.defined()
                  ? CheckedState(Traits::kName, name, Descriptor::kStates[slot], p, held,
                                 held_absmax, map, state_dtype)
                  : FreshState(p, Descriptor::InitialState(hyper, slot), map, state_dtype);
          seg.state[slot] = ready.values.data_ptr();
          if (ready.absmax.defined()) seg.absmax[slot] = ready.absmax.data_ptr<float>();
          if (!ready.values.is_same(held)) new_tensors.emplace_back(&held, std::move(ready.values));
          // An absmax new, converted, or dropped with the codes it scaled.
          if (absmax != nullptr && !ready.absmax.is_same(held_absmax)) {
            new_tensors.emplace_back(&held_absmax, std::move(ready.absmax));
          }
        }
        if constexpr (algos::HasScalarStates<Descriptor>) {
          // The core writes a scalar state in place after the update, so a held one changes only
          // when the step succeeds; new and converted ones are committed like the tensors.
          const auto scalars = Traits::Scalars(*state);
          for (std::size_t k = 0; k < Descriptor::kScalarStates.size(); ++k) {
            at::Tensor& held = *scalars[k];
            at::Tensor ready =
                held.defined()
                    ? CheckedScalar(Traits::kName, name, Descriptor::kScalarStates[k], held)
                    : at::full({}, Descriptor::InitialScalar(hyper, static_cast<int>(k)),
                               at::TensorOptions{}.dtype(at::kFloat));
            seg.scalars[k] = ready.data_ptr<float>();
            if (!ready.is_same(held)) new_tensors.emplace_back(&held, std::move(ready));
          }
        }
      }
      segments.push_back(seg);
      params.push_back(p);
      names.push_back(name);
      states.push_back(state);
    }
  }
  // A step() with no param holding a grad does nothing (nor is it a micro-batch).
  if ((accumulating ? batch_grads.empty() : segments.empty()) && routed_why.empty()) return loss;
  CheckDisjoint(Traits::kName, params, names);
  if (accumulating) CheckDisjoint(Traits::kName, batch_params, batch_names);
  const bool routing = !routed_why.empty();
  if (routing) {
    TORCH_WARN_ONCE(Traits::kName,
                    ": these params take torch::optim's own (unfused) step: ", routed_why,
                    ". Set training().strict = true to make this an error.");
  }
  // With accumulation, routed params are summed here, in torch: grad · (inv_scale / steps) in the
  // gradient's own dtype and layout, as the Python classes sum them; an Inf/NaN in a sum is the
  // micro-batch's overflow (the scaler backs off, the window is skipped). The window's last call
  // steps them by the twin on their sums, after the fused update.
  std::unordered_map<const void*, Accumulation::Sum> routed_sums;  // committed after the call
  bool routed_inf = false;
  if (accumulating) {
    TORCH_CHECK((!routing && accumulation.routed.empty()) ||
                    clipping.max_norm == std::numeric_limits<double>::infinity(),
                Traits::kName, ": max_grad_norm ", clipping.max_norm,
                " with training().accumulation_steps > 1 needs every param on the fused path (",
                routing ? routed_why : "routed params are in the window", ")");
    routed_sums = accumulation.routed;
    const double factor = double{grad_scale} / static_cast<double>(window.steps);
    for (const auto& group : routed) {
      for (const at::Tensor& p : group) {
        const at::Tensor add = p.grad() * factor;
        if (!add.is_meta()) {  // (a meta tensor has no values: shape-only, as torch steps it)
          const at::Tensor values = add.is_sparse() ? add.coalesce().values() : add;
          routed_inf |= !at::isfinite(values).all().item<bool>();
        }
        Accumulation::Sum& held = routed_sums[p.unsafeGetTensorImpl()];
        held = {.param = p, .sum = held.sum.defined() ? held.sum + add : add, .in_window = true};
      }
    }
  }
  // Without accumulation, what spans both partitions runs here, once over all gradients: the
  // overflow check and the global norm (MixedPrePass); TrainingStep then runs without scaler and
  // clipping, the clip coefficient folded into every grad_scale, and the routed grads get the
  // same factor.
  StepResult mixed;
  float routed_scale = 1.0f;
  if (routing && !accumulating) {
    if (!MixedPrePass(grads, routed, clipping, grad_scale, mixed)) {
      if (scaler != nullptr) scaler->Update(true);
      result = mixed;
      return loss;
    }
    routed_scale = grad_scale * mixed.clip_coef;
    for (Segment& seg : segments) seg.grad_scale = routed_scale;
  }

  StepResult outcome;
  outcome.stepped = true;  // (a step of routed params only)
  const MicroBatch micro_batch{.window = &window,
                               .grads = batch_grads,
                               .sums = batch_sums,
                               .fresh = fresh,
                               .grad_scale = grad_scale};
  // (a routed Inf/NaN skips the window and updates the scaler here, the micro-batch's overflow)
  if (routed_inf) window.found_inf = true;
  if (!segments.empty() || accumulating) {
    try {
      // A micro-batch that does not close its window is not stepped, but its groups' options are
      // checked as the window's last call will check them (an empty step validates them).
      if (!closes) TrainingStep(std::span<const Hyper>(hypers), std::span<Segment>(), {});
      outcome = TrainingStep(
          std::span<const Hyper>(hypers), std::span<Segment>(segments),
          {.scaler = (routing && !accumulating) || routed_inf ? nullptr : scaler,
           .max_grad_norm = routing ? std::numeric_limits<double>::infinity() : clipping.max_norm,
           .norm_type = clipping.norm_type,
           .clip_rule = clipping.clip_rule,
           .micro_batch = accumulating ? &micro_batch : nullptr},
          DefaultRuntime());
    } catch (const fusedopt::Error& e) {
      TORCH_CHECK(false, Traits::kName, ": ", e.what());
    }
  }
  if (routed_inf) {
    if (scaler != nullptr) scaler->Update(true);
    outcome.found_inf = true;
  }
  if (accumulating) {  // the micro-batch was added (and the window closed, if this was its last)
    accumulation.window = window;
    accumulation.routed = closes ? decltype(routed_sums){} : routed_sums;
    for (auto& [key, sum] : new_sums) accumulation.sums[key].sum = std::move(sum);
    for (const at::Tensor& p : batch_params) {
      Accumulation::Sum& held = accumulation.sums[p.unsafeGetTensorImpl()];
      held.param = p;
      held.in_window = !closes;
    }
    if (closes) {
      for (auto& [key, held] : accumulation.sums) held.in_window = false;
    }
  }
  if (outcome.pre_pass_begin) {
    pre_pass = FusedStepOptions::Interval{*outcome.pre_pass_begin, *outcome.pre_pass_end};
  }
  if (!outcome.stepped) {  // skipped: nothing new is committed, params are untouched
    result = outcome;
    return loss;
  }

  // Commit: the step happened.
  for (auto& [slot, tensor] : new_tensors) *slot = std::move(tensor);
  for (std::size_t k = 0; k < segments.size(); ++k) {
    if (states[k] != nullptr) {
      Traits::SetStep(*states[k], segments[k].step);
      if constexpr (kRoundingCount) Traits::SetRoundingStep(*states[k], segments[k].rounding_step);
    }
    // The params changed in place behind autograd's back: bump their version counters as ATen's
    // in-place ops do, so a graph that saved a param for backward reports the modification.
    if (!params[k].is_inference()) params[k].unsafeGetTensorImpl()->bump_version();
  }
  for (auto& [key, state] : new_states) state_map[key] = std::move(state);
  result = outcome;
  // After the fused part: its checks of the options came first.
  if constexpr (requires { typename Traits::Twin; }) {
    if (routing && !accumulating) {
      TwinStep<typename Traits::Twin>(optimizer, routed, [&](const at::Tensor& p) {
        return routed_scale != 1.0f ? p.grad() * routed_scale : at::Tensor();
      });
      if (scaler != nullptr) scaler->Update(false);
      result.grad_norm = mixed.grad_norm;
      result.clip_coef = mixed.clip_coef;
    }
    if (!routed_sums.empty() && closes) {  // the window's routed params, stepped on their sums
      std::vector<std::vector<at::Tensor>> in_window(groups.size());
      for (std::size_t g = 0; g < groups.size(); ++g) {
        for (const at::Tensor& p : groups[g].params()) {
          if (routed_sums.contains(p.unsafeGetTensorImpl())) in_window[g].push_back(p);
        }
      }
      TwinStep<typename Traits::Twin>(optimizer, in_window, [&](const at::Tensor& p) {
        return routed_sums.at(p.unsafeGetTensorImpl()).sum;
      });
    }
  }
  return loss;
}

}  // namespace fusedopt::pt::detail
