// fusedopt::pt: libtorch optimizers whose step() is one fused fusedopt pass over every parameter.
//
// Each class is a drop-in for its torch::optim namesake: it *is* that class (public subclass), so
// it takes the same options type (torch::optim::AdamOptions, ...), the same param groups, and keeps
// torch's param-state classes (AdamParamState, ...) in state(). Construction checks,
// add_param_group, zero_grad, serialize / torch::save / torch::load are torch's own, which makes
// saved optimizers interchangeable in both directions. Only step() differs: instead of a loop of
// ATen ops per tensor, it hands every param with a defined grad, over all groups, to one
// fusedopt::<Algo>Step call.
//
//   fusedopt::pt::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   loss.backward();
//   opt.step();
//
// Requirements on stepped params (checked with TORCH_CHECK before anything is written; the message
// names the param as param_groups[g].params[i]): CPU, strided and contiguous, dtype float32,
// float16 or bfloat16, a dense grad of the same shape (also float32/float16/bfloat16), no param
// given twice. State tensors are kept in the param's dtype, as torch does. Params whose grad is
// undefined are skipped: no state, no step count, untouched.
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

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <limits>
#include <optional>

#include "fusedopt/grad.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/scaler.h"

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
};

// The training-loop part shared by the five optimizers.
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

 protected:
  TrainingOptions training_;
  StepResult last_step_;
  std::optional<Interval> last_pre_pass_;
};

// SGD with momentum, dampening, Nesterov and weight decay. State: SGDParamState::momentum_buffer,
// created on a param's first step (a copy of its update direction) when momentum != 0.
class SGD : public torch::optim::SGD, public FusedStepOptions {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// Adam (L2 weight decay added to the gradient), optionally AMSGrad. State: AdamParamState.
class Adam : public torch::optim::Adam, public FusedStepOptions {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// AdamW (decoupled weight decay, default 1e-2), optionally AMSGrad. State: AdamWParamState.
class AdamW : public torch::optim::AdamW, public FusedStepOptions {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// RMSprop (eps outside the square root), optionally centered and with momentum.
// State: RMSpropParamState.
class RMSprop : public torch::optim::RMSprop, public FusedStepOptions {
 public:
  using torch::optim::RMSprop::RMSprop;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// Adagrad with lr_decay and weight decay. As torch's, the constructor creates every param's state
// with sum = initial_accumulator_value (the defaults' value); a param added later with
// add_param_group gets its state on its first step, from its group's value.
class Adagrad : public torch::optim::Adagrad, public FusedStepOptions {
 public:
  using torch::optim::Adagrad::Adagrad;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fusedopt::pt
