// fusedopt::pt: libtorch optimizers whose step() is one fused fusedopt pass over every parameter.
//
// SGD, Adam, AdamW, RMSprop and Adagrad are drop-ins for their torch::optim namesakes: each *is*
// that class (public subclass), so it takes the same options type (torch::optim::AdamOptions,
// ...), the same param groups, and keeps torch's param-state classes (AdamParamState, ...) in
// state(). Construction checks, add_param_group, zero_grad, serialize / torch::save / torch::load
// are torch's own, which makes saved optimizers interchangeable in both directions. Only step()
// differs: instead of a loop of ATen ops per tensor, it hands every param with a defined grad, over
// all groups, to one fusedopt::<Algo>Step call.
//
//   fusedopt::pt::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   loss.backward();
//   opt.step();
//
// The other algorithms have no torch::optim twin, so they are not drop-ins: each is the generic
// FusedOptimizer<Hyper> below, a torch::optim::Optimizer written as libtorch writes its optimizers
// (options, param state, the same constructors, get_lr/set_lr for schedulers, torch::save /
// torch::load). Lion and LAMB follow their references, as the Python fusedopt.FusedLion and
// fusedopt.FusedLAMB do: Lion lucidrains' lion-pytorch (arguments, defaults, update, its
// constructor's checks; state exp_avg), LAMB apex's FusedLAMB (arguments, defaults, formulas, the
// trust ratio, its constructor's checks and its global gradient clipping by max_grad_norm), with
// torch's per-param step count where apex keeps one per group.
//
// Requirements on stepped params (checked with TORCH_CHECK before anything is written; the message
// names the param as param_groups[g].params[i]): CPU, strided and contiguous, dtype float32,
// float16 or bfloat16, a dense grad of the same shape (also float32/float16/bfloat16), no param
// given twice. State tensors are kept in the param's dtype, as torch does, unless
// training().state_dtype says otherwise (8-bit codes, 16-bit states; TrainingOptions). Params whose
// grad is undefined are skipped: no state, no step count, untouched. SGD, Adam, AdamW, RMSprop and
// Adagrad take any param their torch::optim twin takes: those the engine cannot (float64,
// non-contiguous, non-CPU, sparse grads for SGD and Adagrad) go through the twin's own step in
// the same step(), bit for bit torch's (TrainingOptions::strict makes them errors instead).
//
// The step runs on fusedopt::DefaultRuntime(): OMP_NUM_THREADS threads, or one per core
// (fusedopt::DefaultRuntime().set_num_threads(n) changes it); results do not depend on the count.
//
// Numerics follow torch.optim 2.x's single-tensor Python code (Adam/AdamW/RMSprop use lerp_ for the
// running means where libtorch's C++ loop uses mul_+add_), so results agree with torch::optim
// within a few f32 ulps per step, and SGD agrees bit for bit on FMA machines. torch::optim's
// options have no `maximize` flag; neither do these classes.
//
// Training-loop features (fusedopt::StepOptions' semantics): every class also has training()
// options, read on each step(), and last_step(), what the latest step() did.
//
//   fusedopt::LossScaler scaler;                         // torch.amp.GradScaler's policy
//   opt.training() = {.scaler = &scaler, .max_grad_norm = 1.0};
//   (loss * scaler.scale()).backward();
//   opt.step();                                          // unscale, clip, skip on overflow, update
//   if (!opt.last_step().stepped) ...                    // the gradients held Inf/NaN
//
// With a scaler, every gradient is read as grad * scaler->inv_scale(); with a scaler or a finite
// max_grad_norm, step() first runs fusedopt::GradPrePass (one read of all gradients for the
// non-finite flag and the global norm; the clip coefficient is folded into the update, no gradient
// is written). If some gradient is Inf/NaN, the step is skipped: params, state() and step counts
// stay bit-identical and no state is created; then scaler->Update(true). Otherwise the params are
// updated and scaler->Update(false) follows. Clipping this way equals
// fusedopt::pt::ClipGradNorm(params, max_grad_norm) followed by a plain step(), bit for bit for f32
// gradients (the same f32 factor, applied by the same f32 multiply), and
// torch::nn::utils::clip_grad_norm_ then step() up to rounding (torch sums the norm in f32, so its
// factor can be an ulp away). A step() with no param holding a grad does nothing (the scaler is not
// updated). Without a scaler and with max_grad_norm = Inf (the defaults), step() is exactly the
// plain fused step. Gradient clipping and lr schedules for any optimizer: fusedopt/pt/training.h.
#pragma once

#include <torch/arg.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/scaler.h"
#include "fusedopt/training_step.h"

namespace fusedopt::pt {

// What step() does around the update: fusedopt::StepOptions for torch-held params.
struct TrainingOptions {
  // The gradients hold loss * scaler->scale(): step() unscales them, skips on overflow and calls
  // scaler->Update() (the scaler must outlive its use here). Null: gradients are used as they are.
  LossScaler* scaler = nullptr;
  // Clip the global norm of the (unscaled) gradients of all stepped params to this, as
  // torch::nn::utils::clip_grad_norm_ does; Inf: no clipping. Must be >= 0.
  double max_grad_norm = std::numeric_limits<double>::infinity();
  NormType norm_type = NormType::kL2;
  // SGD, Adam, AdamW, RMSprop and Adagrad hand params the engine cannot take (float64, non-CPU,
  // non-contiguous, a sparse grad for SGD and Adagrad) to their torch::optim twin's own step, for
  // those params, within the same step() (warning once); the scaler's unscale and skip and the
  // global norm of max_grad_norm span both. strict = true: each of them is an error.
  bool strict = false;
  // The dtype step() keeps the states in, the Python classes' state_dtype. nullopt: torch's rule,
  // the param's dtype. torch::kFloat, kHalf or kBFloat16: that dtype for every param.
  // torch::kUInt8: 8-bit block-wise states (docs/8bit-states.md: bitsandbytes' dynamic maps, one
  // f32 absmax per block of kQuantBlock elements, kept in the param state as "<key>_absmax") for
  // the params of at least min_8bit_size elements, the param's dtype for smaller ones; only for
  // the algorithms whose update pass is element-wise (not AdamP, Adafactor). A state held in
  // another form (kept before the option changed, or loaded) is converted by the next step that
  // takes its param, within that step's all-or-nothing commit.
  std::optional<c10::ScalarType> state_dtype = std::nullopt;
  std::size_t min_8bit_size = kMin8bitSize;
  // The Python classes' stochastic_rounding and seed (docs/numerics.md): stores of 16-bit params
  // and 16-bit states round stochastically, the noise of an element a function of the seed, the
  // param's step count and the element's index in all groups' params laid end to end, so a run
  // keeps its noise when it moves between libtorch and Python. Off: round to nearest even.
  bool stochastic_rounding = false;
  std::uint64_t rounding_seed = 0;
  // Gradient accumulation in the optimizer, the Python classes' accumulation_steps: each step()
  // adds every gradient, times (scaler->inv_scale() or 1) / accumulation_steps rounded once to
  // f32, into an f32 sum per param (fusedopt::AccumulateGrads), and only every
  // accumulation_steps-th step() updates, from the sums: one step on the window's mean gradient,
  // clipping included. The scaler is updated with each micro-batch's own overflow check; a window
  // where some micro-batch held Inf/NaN is skipped whole. A param with a gradient in only some
  // micro-batches is stepped from the sum of those. A param that takes torch::optim's own step
  // (routed: a float64 param, a sparse gradient, ...) has its sum in torch, in the gradient's own
  // dtype and layout (grad · (inv_scale / accumulation_steps)), and the window's last step() runs
  // the twin's step on those sums after the fused update, as the Python classes do; an Inf/NaN in
  // it skips the window too. max_grad_norm then needs every param on the fused path.
  // SaveCheckpoint keeps the window (the sums and how far it is), as the Python classes'
  // save_checkpoint does, and so does torch::save (torch::load then needs the same
  // accumulation_steps set first). >= 1; change it between windows.
  std::int64_t accumulation_steps = 1;
};

namespace detail {
// The window of TrainingOptions::accumulation_steps: how far it is, and each param's sum.
struct Accumulation {
  AccumulationWindow window;
  struct Sum {
    at::Tensor param;        // keeps the key, its TensorImpl, alive
    at::Tensor sum;          // the param's shape: f32 (sums), the gradient's dtype (routed)
    bool in_window = false;  // it holds a gradient of this window
  };
  std::unordered_map<const void*, Sum> sums;
  // The sums of the params that take torch::optim's own step, all in the window (emptied when it
  // closes).
  std::unordered_map<const void*, Sum> routed;
};
}  // namespace detail

// The training-loop part shared by the seven optimizers.
class FusedStepOptions {
 public:
  TrainingOptions& training() { return training_; }
  const TrainingOptions& training() const { return training_; }
  void set_training(const TrainingOptions& options) { training_ = options; }
  // What the latest step() did: stepped, found_inf, grad_norm (of the unscaled gradients, when the
  // pre-pass ran) and clip_coef. Default-constructed before the first step(), after one that found
  // no param with a grad, and after one that threw.
  const StepResult& last_step() const { return last_step_; }
  // When the latest step() ran the gradient pre-pass: when it began and ended (for timelines).
  struct Interval {
    std::chrono::steady_clock::time_point begin, end;
  };
  const std::optional<Interval>& last_pre_pass() const { return last_pre_pass_; }
  // The micro-batches added to the current accumulation window (training().accumulation_steps):
  // 0 between windows.
  std::int64_t pending_micro_batches() const { return accumulation_.window.pending; }
  // The window itself, for checkpoints (fusedopt/pt/checkpoint.h).
  const detail::Accumulation& accumulation() const { return accumulation_; }
  detail::Accumulation& accumulation() { return accumulation_; }

 protected:
  TrainingOptions training_;
  StepResult last_step_;
  std::optional<Interval> last_pre_pass_;
  detail::Accumulation accumulation_;
};

// SGD with momentum, dampening, Nesterov and weight decay. State: SGDParamState::momentum_buffer,
// created on a param's first step (a copy of its update direction) when momentum != 0.
class SGD : public torch::optim::SGD, public FusedStepOptions {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load: torch's archive, states with their absmax, and the window
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

// Adam (L2 weight decay added to the gradient), optionally AMSGrad. State: AdamParamState.
class Adam : public torch::optim::Adam, public FusedStepOptions {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load: torch's archive, states with their absmax, and the window
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

// AdamW (decoupled weight decay, default 1e-2), optionally AMSGrad. State: AdamWParamState.
class AdamW : public torch::optim::AdamW, public FusedStepOptions {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load: torch's archive, states with their absmax, and the window
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

// RMSprop (eps outside the square root), optionally centered and with momentum.
// State: RMSpropParamState.
class RMSprop : public torch::optim::RMSprop, public FusedStepOptions {
 public:
  using torch::optim::RMSprop::RMSprop;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load: torch's archive, states with their absmax, and the window
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

// Adagrad with lr_decay and weight decay. As torch's, the constructor creates every param's state
// with sum = initial_accumulator_value (the defaults' value); a param added later with
// add_param_group gets its state on its first step, from its group's value.
class Adagrad : public torch::optim::Adagrad, public FusedStepOptions {
 public:
  using torch::optim::Adagrad::Adagrad;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load: torch's archive, states with their absmax, and the window
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

// ---- The other algorithms of the engine: one generic class each ---------------------------------
//
// Every other algorithm (those of torch.optim that libtorch lacks, such as NAdam and Adafactor;
// Lion, LAMB, LARS (apex LARC around SGD, as fusedopt.FusedLARS), RMSpropTF, AdamP, BertAdam) is
// one template, FusedOptimizer<Hyper>, over the core's hyper struct: the options are that struct
// (its fields are the reference's argument names, with betas as beta1/beta2 and Adafactor's eps as
// eps1/eps2, and its defaults), the param state is the reference's state keys of the algorithm
// (state(key): "exp_avg", "exp_inf", ... and the 0-d f32 scalar states such as NAdam's
// "mu_product") with the step count. Built as libtorch builds its optimizers: constructors taking
// param groups or tensors plus the defaults (checked as the reference checks its arguments for Lion
// and LAMB, by the engine's rules for the algorithm, as fusedopt.Fused<Algo> checks them, for the
// others: c10::Error naming the option; a rejected group is not kept), get_lr/set_lr for
// schedulers, torch::save / torch::load of options (under the reference's group keys: "betas" a
// pair) and state. A group given with its own options keeps the keys set away from their
// constructor defaults and takes the others from the optimizer's defaults, as libtorch 2.13 merges
// its own optimizers' groups; libtorch's add_param_group cannot merge options types it does not
// know (it keeps the defaults), so call add_param_group on the class itself, not through a
// torch::optim::Optimizer&. Numerics are the reference's (the engine's, see docs/numerics.md).
// There is no torch::optim twin to take the params the engine cannot (float64, non-CPU,
// non-contiguous): those are errors.
//
//   fusedopt::pt::NAdam opt(model->parameters(), fusedopt::NadamHyper{.lr = 2e-3});
//   fusedopt::pt::Lion lion(model->parameters(),
//   fusedopt::pt::LionOptions(1e-4).weight_decay(0.1)); opt.step();
//
// Lion: lion-pytorch's Lion(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0); θ *= 1 − lr·λ;
// θ −= lr·sign(β1·m + (1 − β1)·g); m = β2·m + (1 − β2)·g. weight_decay multiplies lr,
// lion-pytorch's default; for its decoupled_weight_decay=True, pass weight_decay / lr of the
// constructor. The constructor checks lion-pytorch's rules (lr > 0, betas in [0, 1]) and
// weight_decay >= 0. State: exp_avg, in the param's dtype (lion-pytorch keeps no step count; the
// class counts its steps).
//
// LAMB: apex FusedLAMB(lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
// weight_decay=0.01, adam_w_mode=True, grad_averaging=True, max_grad_norm=1.0, use_nvlamb=False).
// There is no amsgrad field (apex rejects amsgrad=True) and no set_grad_none (zero_grad() sets
// grads to none already). Adam's moments, the update u = m̂ / (√v̂ + eps) (+ λθ in adam_w_mode),
// then per tensor θ −= lr·(‖θ‖ / ‖u‖)·u where weight_decay != 0 or use_nvlamb and both norms are
// non-zero (else θ −= lr·u). The constructor checks apex's rules (lr, eps, weight_decay >= 0; betas
// in [0, 1)) and max_grad_norm >= 0. State: step, exp_avg, exp_avg_sq.
//
// LAMB's max_grad_norm (ExtraOptions) is apex's global clipping: before the update, every gradient
// is scaled by max_grad_norm / ‖all gradients‖₂ when that norm exceeds it (apex divides by the
// inverse ratio: at most 1 ulp apart). It is one threshold for the whole step, so every param
// group must hold the same value (apex reads it from its defaults); inf: no clipping; 0 zeroes
// every non-zero gradient, as apex's division by an infinite ratio does; it must be >= 0. This
// clipping takes the place of training().max_grad_norm, which must stay inf for LAMB (and
// norm_type kL2; a Trainer's max_grad_norm is training()'s); the norm and the factor are reported
// in last_step(). With a loss scaler the norm is that of the unscaled gradients.

// What a reference keeps in its param groups beyond the algorithm's hyper-parameters: apex
// FusedLAMB's max_grad_norm (the step's clipping, not the engine's update).
template <class Hyper>
struct ExtraOptions {};
template <>
struct ExtraOptions<LambHyper> {
  double max_grad_norm = 1.0;
};

template <class Hyper>
class HyperOptions : public torch::optim::OptimizerCloneableOptions<HyperOptions<Hyper>> {
 public:
  HyperOptions(const Hyper& hyper = {})  // NOLINT(google-explicit-constructor): as torch's options
      : hyper_(hyper) {}
  HyperOptions(double lr) {  // NOLINT(google-explicit-constructor): the other fields at defaults
    hyper_.lr = lr;
  }
  Hyper& hyper() { return hyper_; }
  const Hyper& hyper() const { return hyper_; }
  ExtraOptions<Hyper>& extra() { return extra_; }
  const ExtraOptions<Hyper>& extra() const { return extra_; }
  double get_lr() const override { return hyper_.lr; }
  void set_lr(double lr) override { hyper_.lr = lr; }

  // Builders under the reference's names, as torch's options have them (LionOptions(1e-4)
  // .betas({0.9, 0.99}).weight_decay(0.1)), for the fields the algorithm has: a getter and a
  // setter returning *this each. hyper() reaches every field.
#define FUSEDOPT_PT_OPTION_(T, name)                                        \
  T name() const requires requires(const Hyper& h) { h.name; }              \
  { return hyper_.name; }                                                   \
  HyperOptions& name(T value) requires requires(const Hyper& h) { h.name; } \
  {                                                                         \
    hyper_.name = value;                                                    \
    return *this;                                                           \
  }
  FUSEDOPT_PT_OPTION_(double, lr)
  FUSEDOPT_PT_OPTION_(double, eps)
  FUSEDOPT_PT_OPTION_(double, weight_decay)
  FUSEDOPT_PT_OPTION_(double, momentum)
  FUSEDOPT_PT_OPTION_(double, dampening)
  FUSEDOPT_PT_OPTION_(bool, nesterov)
  FUSEDOPT_PT_OPTION_(bool, maximize)
  FUSEDOPT_PT_OPTION_(bool, amsgrad)
  FUSEDOPT_PT_OPTION_(bool, bias_correction)
  FUSEDOPT_PT_OPTION_(bool, adam_w_mode)
  FUSEDOPT_PT_OPTION_(bool, grad_averaging)
  FUSEDOPT_PT_OPTION_(bool, use_nvlamb)
#undef FUSEDOPT_PT_OPTION_
  // torch's betas pair: (beta1, beta2).
  std::tuple<double, double> betas() const requires requires(const Hyper& h) { h.beta1 + h.beta2; }
  { return {hyper_.beta1, hyper_.beta2}; }
  HyperOptions& betas(const std::tuple<double, double>& betas) requires requires(const Hyper& h) {
    h.beta1 + h.beta2;
  }
  {
    hyper_.beta1 = std::get<0>(betas);
    hyper_.beta2 = std::get<1>(betas);
    return *this;
  }
  // LAMB's global clipping threshold (ExtraOptions).
  double max_grad_norm() const requires requires(const ExtraOptions<Hyper>& e) { e.max_grad_norm; }
  { return extra_.max_grad_norm; }
  HyperOptions& max_grad_norm(double value) requires requires(const ExtraOptions<Hyper>& e) {
    e.max_grad_norm;
  }
  {
    extra_.max_grad_norm = value;
    return *this;
  }

  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  bool operator==(const HyperOptions& other) const;  // field by field

 private:
  Hyper hyper_;
  ExtraOptions<Hyper> extra_;
};

// The absmax of a param's 8-bit states (TrainingOptions::state_dtype torch::kUInt8): absmax[k], an
// f32 vector of one value per block of kQuantBlock elements, beside state slot k's uint8 codes;
// undefined where slot k holds a float tensor. Saved under "<key>_absmax" (the Python classes'
// key).
struct StateAbsmax {
  std::array<torch::Tensor, kMaxStates> absmax;
};

// torch::optim's param state Base (AdamWParamState, ...) of the algorithm of Hyper, with room for
// 8-bit states: the drop-ins load their states as these, and a param's state becomes one when its
// states first become 8-bit. It is a Base, which torch::optim's own step and save take as theirs.
template <class Base, class Hyper>
struct ParamStateWithAbsmax : public Base, public StateAbsmax {
  ParamStateWithAbsmax() = default;
  explicit ParamStateWithAbsmax(const Base& state) : Base(state) {}
  std::unique_ptr<torch::optim::OptimizerParamState> clone() const override {
    return std::make_unique<ParamStateWithAbsmax>(*this);
  }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// torch::optim::SGDParamState with room for 8-bit states and a step count: torch's SGD keeps none,
// but stochastic rounding keys its noise by one (training().stochastic_rounding; without one every
// step would round with the same noise). A param's state becomes one when it is first stepped with
// stochastic rounding; saved under "rounding_step" (the Python classes' key) once not 0.
struct SgdParamState : public ParamStateWithAbsmax<torch::optim::SGDParamState, SgdHyper> {
  TORCH_ARG(std::int64_t, rounding_step) = 0;  // the steps this param took with the count kept

 public:
  SgdParamState() = default;
  explicit SgdParamState(const torch::optim::SGDParamState& state) : ParamStateWithAbsmax(state) {}
  std::unique_ptr<torch::optim::OptimizerParamState> clone() const override {
    return std::make_unique<SgdParamState>(*this);
  }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

template <class Hyper>
struct HyperParamState : public torch::optim::OptimizerCloneableParamState<HyperParamState<Hyper>>,
                         public StateAbsmax {
  // The steps this param had a grad. An algorithm with torch's state['step'] reads it; the others
  // (Lion, LARS) read only whether their first state is new, and stochastic rounding keys its noise
  // by it (saved as "rounding_step" in checkpoints, the Python classes' key).
  TORCH_ARG(std::int64_t, step) = 0;

 public:
  // The Segment::state slots (indexed by the algorithm's state enum, fusedopt/hyper.h), in the
  // param's dtype, and the scalar states, 0-d float32; undefined until the algorithm uses them.
  std::array<torch::Tensor, kMaxStates> tensors;
  std::array<torch::Tensor, kMaxScalars> scalars;

  // The tensor of torch's state key `key` (a slot or a scalar state); c10::Error for a key the
  // algorithm does not have.
  torch::Tensor& state(std::string_view key);
  const torch::Tensor& state(std::string_view key) const;
  // Accessors under the keys Adam-like states have, as torch's param states have them (state(key);
  // c10::Error for an algorithm without the key).
  const torch::Tensor& exp_avg() const { return state("exp_avg"); }
  HyperParamState& exp_avg(const torch::Tensor& t) {
    state("exp_avg") = t;
    return *this;
  }
  const torch::Tensor& exp_avg_sq() const { return state("exp_avg_sq"); }
  HyperParamState& exp_avg_sq(const torch::Tensor& t) {
    state("exp_avg_sq") = t;
    return *this;
  }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  bool operator==(const HyperParamState& other) const;  // step, tensor values and absmax
};

template <class Hyper>
class FusedOptimizer : public torch::optim::Optimizer, public FusedStepOptions {
 public:
  using Options = HyperOptions<Hyper>;
  using ParamState = HyperParamState<Hyper>;

  explicit FusedOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                          Options defaults = {});
  explicit FusedOptimizer(std::vector<torch::Tensor> params, Options defaults = {});

  // Optimizer::add_param_group, keeping the group's options (merged with the defaults).
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // "fusedopt::pt::NAdam": torch.optim's class name, as messages name it.
  static std::string class_name();
};

// ---- Every algorithm's class, by the public list (fusedopt/hyper.h) -----------------------------
//
// ClassOf<Hyper>: the class of the algorithm of Hyper, its options and its param state: the
// torch::optim drop-ins above, the generic classes for the others. The names
// users write (fusedopt::pt::NAdam, NAdamOptions, NAdamParamState; SGDOptions is
// torch::optim::SGDOptions) are FUSEDOPT_FOR_EACH_ALGORITHM's aliases of it, so a new algorithm's
// class needs no line here. The generic ones, beyond what their section above says:
//   LARS         apex LARC around SGD (fusedopt.FusedLARS): momentum_buffer, and a step count SGD
//                does not keep.
//   AdamP        clovaai's AdamP (fusedopt.FusedAdamP): a param of more than one dimension is
//                projected per channel row (its size(0)) or as a whole, as the reference decides
//                each step.
//   BertAdam     torch_npu NpuFusedBertAdam / HF BertAdam (fusedopt.FusedBertAdam): no bias
//                correction, the lr schedules, and max_grad_norm clipping per (group, param dtype)
//                inside the step.
//   Adafactor    torch.optim.Adafactor (fusedopt.FusedAdafactor): lr 1e-2, beta2_decay -0.8, eps1
//                and eps2 (torch's eps tuple, 1e-3 for eps2), d 1.0, weight_decay 0.0, maximize
//                false. A param of more than one dimension keeps state "row_var" [..., R, 1] and
//                "col_var" [..., 1, C] (its last two dimensions factored, the leading ones a
//                batch), any other "variance" of its own shape, each in the param's dtype, with the
//                step count; a loaded factor of another shape is an error naming param and key.
//                torch's eps1 None is finfo(dtype).eps of the group's first param with a grad: the
//                default eps1 is finfo(float32).eps, torch's None for float32 params; for a float16
//                or bfloat16 model pass finfo of that dtype (9.765625e-4, 7.8125e-3) to match
//                torch's default. A param of no elements is an error (torch's step divides by its
//                numel).
template <class Hyper>
struct ClassOf {
  using type = FusedOptimizer<Hyper>;
  using Options = HyperOptions<Hyper>;
  using ParamState = HyperParamState<Hyper>;
};
// The classes of their own: the drop-ins keep torch's options and param states.
template <class Class, class OptionsT, class ParamStateT>
struct OwnClass {
  using type = Class;
  using Options = OptionsT;
  using ParamState = ParamStateT;
};
template <>
struct ClassOf<SgdHyper> : OwnClass<SGD, torch::optim::SGDOptions, torch::optim::SGDParamState> {};
template <>
struct ClassOf<AdamHyper>
    : OwnClass<Adam, torch::optim::AdamOptions, torch::optim::AdamParamState> {};
template <>
struct ClassOf<AdamWHyper>
    : OwnClass<AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState> {};
template <>
struct ClassOf<RmspropHyper>
    : OwnClass<RMSprop, torch::optim::RMSpropOptions, torch::optim::RMSpropParamState> {};
template <>
struct ClassOf<AdagradHyper>
    : OwnClass<Adagrad, torch::optim::AdagradOptions, torch::optim::AdagradParamState> {};

// An alias that names a class of its own (SGD, Adam) redeclares that class's name as itself, which
// C++ allows ([dcl.typedef]).
// NOLINTBEGIN(bugprone-macro-parentheses): Alias is the name declared
#define FUSEDOPT_PT_ALIASES_(Stem, Alias)               \
  using Alias = ClassOf<Stem##Hyper>::type;             \
  using Alias##Options = ClassOf<Stem##Hyper>::Options; \
  using Alias##ParamState = ClassOf<Stem##Hyper>::ParamState;
// NOLINTEND(bugprone-macro-parentheses)
FUSEDOPT_FOR_EACH_ALGORITHM(FUSEDOPT_PT_ALIASES_)
#undef FUSEDOPT_PT_ALIASES_
// LAMB's options and state under the names they had when LAMB was a class of its own.
using LambOptions = LAMBOptions;
using LambParamState = LAMBParamState;

}  // namespace fusedopt::pt
