// A few-line training loop over libtorch (MindSpore's Model(net, loss_fn, optimizer).train idea):
// the Trainer runs forward, backward and the optimizer, and wires in what a real loop needs —
// gradient accumulation, loss scaling, global-norm clipping, an lr schedule, CPU autocast,
// checkpoints and a timeline — for a fusedopt::pt optimizer (which does the unscale, overflow check
// and clip inside its one fused step) or any torch::optim optimizer (torch's own way: a foreach
// unscale + non-finite check, clip_grad_norm_, then step).
//
//   torch::nn::Sequential model(torch::nn::Linear(784, 128), torch::nn::ReLU(),
//                               torch::nn::Linear(128, 10));
//   fusedopt::pt::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   fusedopt::pt::Trainer trainer(model, [&](const torch::Tensor& x) { return model->forward(x); },
//                                 torch::nn::functional::cross_entropy, optimizer,
//                                 {.max_grad_norm = 1.0,
//                                  .schedule = fusedopt::WarmupCosine(1e-3, 100, 1000, 1e-5)});
//   trainer.Train(next_batch, /*updates=*/1000);  // next_batch() returns the next Batch
//
// (docs/train.md has the same example with every option; the docs check compiles and runs it.)
//
// One update = accumulation_steps micro-batches (each loss divided by accumulation_steps, so the
// gradients sum to the mean's gradient, as torch users write it) followed by one optimizer step and
// zero_grad() (a fusedopt::pt optimizer's own training().accumulation_steps must be 1; the trainer
// sets its scaler and max_grad_norm for each step). With a LossScaler the backward runs on loss *
// scale and a step whose gradients hold Inf/NaN is skipped (params and optimizer state untouched),
// as torch.amp.GradScaler does.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/timeline.h"
#include "fusedopt/scaler.h"
#include "fusedopt/schedule.h"

namespace fusedopt::pt {

struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

struct TrainerOptions {
  int accumulation_steps = 1;  // micro-batches per optimizer update, >= 1
  // Clip the global L2 norm of the (unscaled) gradients to this before each update; Inf: never.
  double max_grad_norm = std::numeric_limits<double>::infinity();
  // lr (and momentum) of update t, set on every param group before the step (ApplySchedule).
  std::optional<Schedule> schedule = {};
  LossScaler* scaler = nullptr;  // loss scaling; must outlive the trainer
  // Run forward and loss under CPU autocast to this dtype (kBFloat16 or kHalf); params stay f32.
  std::optional<c10::ScalarType> autocast_dtype = {};
  // Checkpoints (fusedopt/pt/checkpoint.h: model, optimizer, scaler, update count; the format
  // fusedopt.Trainer writes and reads): every `checkpoint_every` updates, durably to
  // checkpoint_dir/step-NNNNNNNN.safetensors (NNNNNNNN: micro-batches trained so far), keeping
  // the newest `keep_last` (0: all). The folder is made and checked writable when the Trainer is
  // built, and temporary files of killed saves in it are removed.
  std::string checkpoint_dir = {};
  std::int64_t checkpoint_every = 0;
  int keep_last = 0;
  // Continue from the newest checkpoint in checkpoint_dir that verifies, when the Trainer is built
  // (none: start afresh); resumed_from() and skipped_checkpoints() say what it found.
  bool resume = false;
  // Record spans (step, data, forward, backward, optimizer, pre_pass, zero_grad, checkpoint) on
  // this process.
  Timeline* timeline = nullptr;
  int timeline_pid = 1;
};

// What one update took and gave. Times in milliseconds, summed over its micro-batches.
struct UpdateStats {
  std::int64_t update = 0;  // 0-based index of this update
  double loss = 0.0;        // mean loss of its micro-batches (unscaled)
  bool stepped = false;     // false: skipped (non-finite gradients under loss scaling)
  // optimizer: unscale / overflow check / clip and the update; zero_grad: releasing the gradients
  // (torch's set_to_none), the same work for every optimizer, so it is not counted as the
  // optimizer's. step: all of them, back to back.
  double data_ms = 0.0, forward_ms = 0.0, backward_ms = 0.0, optimizer_ms = 0.0, zero_grad_ms = 0.0,
         step_ms = 0.0;
};

// The loss: any callable (output, target) -> scalar tensor, a loss module such as
// torch::nn::CrossEntropyLoss(), or a torch::nn::functional loss like cross_entropy, whose options
// struct is a defaulted third parameter (a function pointer loses the default; it is supplied
// here).
class LossFunction {
 public:
  using Fn = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

  LossFunction() = default;
  template <class F>
  requires std::is_invocable_r_v<torch::Tensor, F&, const torch::Tensor&, const torch::Tensor&>
  LossFunction(F fn) : fn_(std::move(fn)) {}  // NOLINT(google-explicit-constructor)
  template <class Options>
  LossFunction(torch::Tensor (*fn)(const torch::Tensor&, const torch::Tensor&,
                                   const Options&))  // NOLINT(google-explicit-constructor)
      : fn_(fn == nullptr ? Fn()
                          : Fn([fn](const torch::Tensor& output, const torch::Tensor& target) {
                              return fn(output, target, Options{});
                            })) {}

  torch::Tensor operator()(const torch::Tensor& output, const torch::Tensor& target) const {
    return fn_(output, target);
  }
  explicit operator bool() const { return static_cast<bool>(fn_); }

 private:
  Fn fn_;
};

class Trainer {
 public:
  using Forward = std::function<torch::Tensor(const torch::Tensor& input)>;
  using Loss = LossFunction;
  using DataSource = std::function<Batch()>;  // the next micro-batch

  // Throws std::invalid_argument naming the option and value for accumulation_steps < 1,
  // max_grad_norm < 0 or NaN, checkpoint_every < 0 (or > 0 without a checkpoint_dir), keep_last <
  // 0, resume without a checkpoint_dir, an autocast dtype other than bf16/f16, or a null model /
  // forward / loss; std::system_error for a checkpoint_dir that cannot be written;
  // fusedopt::CheckpointError for a resume checkpoint that does not fit.
  Trainer(std::shared_ptr<torch::nn::Module> model, Forward forward, Loss loss,
          torch::optim::Optimizer& optimizer, TrainerOptions options = {});
  // A module holder as libtorch builds them: torch::nn::Sequential, torch::nn::Linear,
  // TORCH_MODULE.
  template <class Impl>
  Trainer(const torch::nn::ModuleHolder<Impl>& model, Forward forward, Loss loss,
          torch::optim::Optimizer& optimizer, TrainerOptions options = {})
      : Trainer(model.ptr(), std::move(forward), std::move(loss), optimizer, std::move(options)) {}

  // One update. `warmup` only marks its timeline span (tables and the doctor skip warm-up steps).
  UpdateStats Step(const DataSource& next, bool warmup = false);

  // `updates` updates; `on_update` (optional) sees each one (progress bars, logging).
  std::vector<UpdateStats> Train(const DataSource& next, std::int64_t updates,
                                 const std::function<void(const UpdateStats&)>& on_update = {});

  // Model parameters and buffers, optimizer state, scaler and update count (counters "updates"
  // and "step", the micro-batches). Loading restores them so that training continues bit for bit;
  // a file that does not fit throws fusedopt::CheckpointError and changes nothing.
  void SaveCheckpoint(const std::string& path) const;
  void LoadCheckpoint(const std::string& path);
  // The checkpoint `resume` loaded (empty: none), and the newer ones it skipped ("path: why").
  const std::string& resumed_from() const { return resumed_from_; }
  const std::vector<std::string>& skipped_checkpoints() const { return skipped_; }

  std::int64_t updates() const { return updates_; }
  // Micro-batches trained: updates() · accumulation_steps (where a data source resumes).
  std::int64_t micro_batches() const { return updates_ * options_.accumulation_steps; }
  // True when the optimizer is a fusedopt::pt one (clipping and unscaling fused into its step).
  bool fused() const { return fused_ != nullptr; }

 private:
  double OptimizerStep(bool& stepped);

  std::shared_ptr<torch::nn::Module> model_;
  Forward forward_;
  Loss loss_;
  torch::optim::Optimizer& optimizer_;
  FusedStepOptions* fused_;  // the optimizer's fused side, or null for torch::optim
  TrainerOptions options_;
  std::int64_t updates_ = 0;
  std::string resumed_from_;
  std::vector<std::string> skipped_;
};

}  // namespace fusedopt::pt
