// fusedopt/pt/trainer.h: the update loop, its timeline spans and checkpoints.

#include "fusedopt/pt/trainer.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "fusedopt/pt/checkpoint.h"
#include "fusedopt/pt/training.h"
#include "src/checkpoint/checkpoint_dir.h"

namespace fusedopt::pt {
namespace {

template <class T>
[[noreturn]] void Reject(const std::string& name, const T& value, const std::string& why) {
  throw std::invalid_argument("fusedopt::pt::Trainer: invalid " + name + " " +
                              std::to_string(value) + " (" + why + ")");
}

// CPU autocast for the scope of forward + loss, restored (and its cast cache cleared) after, as
// torch.autocast("cpu", dtype) does.
class AutocastScope {
 public:
  explicit AutocastScope(std::optional<c10::ScalarType> dtype) : active_(dtype.has_value()) {
    if (!active_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCPU);
    previous_dtype_ = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, *dtype);
    at::autocast::increment_nesting();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  ~AutocastScope() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, previous_dtype_);
  }

 private:
  bool active_;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::kFloat;
};

std::vector<torch::Tensor> ParamsWithGrad(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (p.grad().defined()) params.push_back(p);
    }
  }
  return params;
}

}  // namespace

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, Forward forward, Loss loss,
                 torch::optim::Optimizer& optimizer, TrainerOptions options)
    : model_(std::move(model)),
      forward_(std::move(forward)),
      loss_(std::move(loss)),
      optimizer_(optimizer),
      fused_(dynamic_cast<FusedStepOptions*>(&optimizer)),
      options_(std::move(options)) {
  if (!model_ || !forward_ || !loss_) {
    throw std::invalid_argument("fusedopt::pt::Trainer: model, forward and loss must be given");
  }
  if (options_.accumulation_steps < 1) {
    Reject("accumulation_steps", options_.accumulation_steps, "must be >= 1");
  }
  if (!(options_.max_grad_norm >= 0.0)) {
    Reject("max_grad_norm", options_.max_grad_norm, "must be >= 0; inf: no clipping");
  }
  if (fused_ != nullptr && fused_->training().accumulation_steps != 1) {
    Reject("optimizer training().accumulation_steps", fused_->training().accumulation_steps,
           "the trainer accumulates in the gradients, TrainerOptions::accumulation_steps; the "
           "optimizer's must be 1");
  }
  if (options_.checkpoint_every < 0 ||
      (options_.checkpoint_every > 0 && options_.checkpoint_dir.empty())) {
    Reject("checkpoint_every", options_.checkpoint_every,
           "must be >= 0, and > 0 only with a checkpoint_dir");
  }
  if (options_.keep_last < 0) Reject("keep_last", options_.keep_last, "must be >= 0; 0: keep all");
  if (options_.resume && options_.checkpoint_dir.empty()) {
    throw std::invalid_argument("fusedopt::pt::Trainer: resume needs a checkpoint_dir");
  }
  if (options_.autocast_dtype.has_value() && *options_.autocast_dtype != c10::kBFloat16 &&
      *options_.autocast_dtype != c10::kHalf) {
    throw std::invalid_argument(std::string("fusedopt::pt::Trainer: invalid autocast_dtype ") +
                                c10::toString(*options_.autocast_dtype) +
                                " (CPU autocast takes bfloat16 or float16)");
  }
  if (!options_.checkpoint_dir.empty()) {
    checkpoint_dir::PrepareCheckpointDir(
        options_.checkpoint_dir,
        "fusedopt::pt::Trainer: checkpoint_dir '" + options_.checkpoint_dir + "'");
  }
  if (options_.resume) {
    if (auto latest = checkpoint_dir::LatestCheckpoint(options_.checkpoint_dir, &skipped_)) {
      LoadCheckpoint(*latest);
      resumed_from_ = *latest;
    }
  }
}

UpdateStats Trainer::Step(const DataSource& next, bool warmup) {
  Timeline* const timeline = options_.timeline;
  const int pid = options_.timeline_pid;
  const std::int64_t t = updates_;
  UpdateStats stats{.update = t};
  model_->train();
  auto step_span = Timeline::Span(timeline, pid, "step", t);
  const float scale = options_.scaler != nullptr ? options_.scaler->scale() : 1.0f;
  for (int micro = 0; micro < options_.accumulation_steps; ++micro) {
    auto data_span = Timeline::Span(timeline, pid, "data", t);
    const Batch batch = next();
    stats.data_ms += data_span.End();

    auto forward_span = Timeline::Span(timeline, pid, "forward", t);
    torch::Tensor loss;
    {
      AutocastScope autocast(options_.autocast_dtype);
      loss = loss_(forward_(batch.input), batch.target);
    }
    stats.forward_ms += forward_span.End();

    auto backward_span = Timeline::Span(timeline, pid, "backward", t);
    torch::Tensor objective = loss.to(torch::kFloat) / options_.accumulation_steps;
    if (options_.scaler != nullptr) objective = objective * scale;
    objective.backward();
    stats.loss += loss.item<double>() / options_.accumulation_steps;
    stats.backward_ms += backward_span.End();
  }

  if (options_.schedule.has_value()) ApplySchedule(optimizer_, *options_.schedule, t);
  stats.optimizer_ms = OptimizerStep(stats.stepped);
  auto zero_span = Timeline::Span(timeline, pid, "zero_grad", t);
  optimizer_.zero_grad();
  stats.zero_grad_ms = zero_span.End();
  stats.step_ms = step_span.End();
  if (timeline != nullptr) timeline->SetWarmup(pid, t, warmup);
  ++updates_;

  if (options_.checkpoint_every > 0 && updates_ % options_.checkpoint_every == 0) {
    auto span = Timeline::Span(timeline, pid, "checkpoint", t);
    SaveCheckpoint(checkpoint_dir::CheckpointName(options_.checkpoint_dir, micro_batches()));
    checkpoint_dir::DropOldCheckpoints(options_.checkpoint_dir, options_.keep_last);
  }
  return stats;
}

// Unscale, overflow check, clip and step; returns the milliseconds it took.
double Trainer::OptimizerStep(bool& stepped) {
  Timeline* const timeline = options_.timeline;
  auto span = Timeline::Span(timeline, options_.timeline_pid, "optimizer", updates_);
  LossScaler* const scaler = options_.scaler;
  if (fused_ != nullptr) {
    // One read of the gradients (overflow + norm) and one fused update that unscales and clips.
    TrainingOptions training = fused_->training();  // keeps the user's norm_type
    training.scaler = scaler;
    training.max_grad_norm = options_.max_grad_norm;
    training.accumulation_steps = 1;  // (the trainer's own accumulation already summed the grads)
    fused_->set_training(training);
    optimizer_.step();
    stepped = fused_->last_step().stepped;
    if (timeline != nullptr && fused_->last_pre_pass().has_value()) {
      const auto& pre = *fused_->last_pre_pass();
      timeline->Record(
          {options_.timeline_pid, "pre_pass", updates_, timeline->MicrosecondsSinceStart(pre.begin),
           std::chrono::duration<double, std::micro>(pre.end - pre.begin).count(), std::nullopt});
    }
  } else {
    // torch's way: GradScaler.unscale_ (one foreach op: unscale + non-finite check), then
    // clip_grad_norm_, then the optimizer's own step.
    stepped = true;
    const std::vector<torch::Tensor> params = ParamsWithGrad(optimizer_);
    if (scaler != nullptr && !params.empty()) {
      std::vector<torch::Tensor> grads;
      grads.reserve(params.size());
      for (const torch::Tensor& p : params) grads.push_back(p.grad());
      torch::Tensor found_inf = torch::zeros({1});
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf,
                                                     torch::full({1}, scaler->inv_scale()));
      stepped = found_inf.item<float>() == 0.0f;
    }
    if (stepped) {
      if (std::isfinite(options_.max_grad_norm) && !params.empty()) {
        torch::nn::utils::clip_grad_norm_(params, options_.max_grad_norm);
      }
      optimizer_.step();
    }
    if (scaler != nullptr && !params.empty()) scaler->Update(!stepped);
  }
  return span.End();
}

std::vector<UpdateStats> Trainer::Train(const DataSource& next, std::int64_t updates,
                                        const std::function<void(const UpdateStats&)>& on_update) {
  if (updates < 0) Reject("updates", updates, "must be >= 0");
  std::vector<UpdateStats> all;
  all.reserve(static_cast<std::size_t>(updates));
  for (std::int64_t i = 0; i < updates; ++i) {
    all.push_back(Step(next));
    if (on_update) on_update(all.back());
  }
  return all;
}

void Trainer::SaveCheckpoint(const std::string& path) const {
  pt::SaveCheckpoint(optimizer_, path,
                     {.model = model_.get(),
                      .scaler = options_.scaler,
                      .counters = {{"updates", updates_}, {"step", micro_batches()}}});
}

void Trainer::LoadCheckpoint(const std::string& path) {
  const CheckpointCounters counters =
      pt::LoadCheckpoint(optimizer_, path, {.model = model_.get(), .scaler = options_.scaler});
  const auto updates = counters.find("updates");
  updates_ = updates != counters.end() ? updates->second : 0;
}

}  // namespace fusedopt::pt
