// Learning-rate schedules as pure functions of the step. A Schedule answers "what is the lr after
// `step` scheduler steps?" in closed form, so it needs no state, can be evaluated at any step in
// any order, and composes (SequentialLr). The factories reproduce torch.optim.lr_scheduler stepped
// once per optimizer step (`opt.step(); sched.step()`): step 0 is the lr torch sets at
// construction (its last_epoch = 0), step t the lr after t calls of sched.step(). torch updates
// most lrs recursively (lr_t = lr_{t-1} * ratio); the closed forms here equal those sequences up
// to rounding (about 1e-15 relative; see docs/schedules.md).
//
// Invalid arguments throw fusedopt::Error naming the argument and its value; so does Lr() for a
// negative step, and OneCycleLr past total_steps (torch raises there too).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fusedopt {

// An immutable value type (a shared pointer to its implementation): cheap to copy, thread-safe.
class Schedule {
 public:
  using Fn = std::function<double(std::int64_t)>;

  // A custom schedule: lr(step) for step >= 0 (torch's LambdaLR, with the base lr folded in).
  // `momentum` may be empty. `description` is what Describe() returns.
  Schedule(std::string description, Fn lr, Fn momentum = {});

  // The lr after `step` scheduler steps (step >= 0).
  double Lr(std::int64_t step) const;
  double operator()(std::int64_t step) const { return Lr(step); }

  // OneCycleLr with cycle_momentum cycles the momentum (SGD's momentum, Adam's beta1) too.
  bool has_momentum() const;
  double Momentum(std::int64_t step) const;  // throws when !has_momentum()

  // E.g. "LinearLr(base_lr=0.1, start_factor=0.25, end_factor=1, total_iters=5)".
  const std::string& Describe() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// lr(t) = lr.
Schedule ConstantSchedule(double lr);

// torch ConstantLR: base_lr * factor for t < total_iters, then base_lr. factor in [0, 1],
// total_iters > 0.
Schedule ConstantLr(double base_lr, double factor = 1.0 / 3, std::int64_t total_iters = 5);

// torch LinearLR: base_lr * (start_factor + (end_factor - start_factor) * min(t, T) / T).
// start_factor in (0, 1], end_factor in [0, 1], total_iters = T > 0.
Schedule LinearLr(double base_lr, double start_factor = 1.0 / 3, double end_factor = 1.0,
                  std::int64_t total_iters = 5);

// torch CosineAnnealingLR: eta_min + (base_lr - eta_min) * (1 + cos(pi * t / t_max)) / 2.
// Not clamped: past t_max the lr rises again with period 2 * t_max, as in torch. t_max > 0.
Schedule CosineAnnealingLr(double base_lr, std::int64_t t_max, double eta_min = 0.0);

// torch StepLR: base_lr * gamma^(t / step_size). step_size > 0, gamma >= 0.
Schedule StepLr(double base_lr, std::int64_t step_size, double gamma = 0.1);

// torch MultiStepLR: base_lr * gamma^(number of milestones <= t). Milestones >= 0 and
// non-decreasing; a repeated milestone applies gamma once per occurrence, as torch's Counter does.
Schedule MultiStepLr(double base_lr, std::vector<std::int64_t> milestones, double gamma = 0.1);

// torch ExponentialLR: base_lr * gamma^t. gamma >= 0.
Schedule ExponentialLr(double base_lr, double gamma);

// torch PolynomialLR: base_lr * (1 - min(t, T) / T)^power. total_iters = T > 0, power >= 0.
Schedule PolynomialLr(double base_lr, std::int64_t total_iters = 5, double power = 1.0);

// torch OneCycleLR (total_steps form). Defaults are torch's.
struct OneCycleOptions {
  double max_lr = 0.0;
  std::int64_t total_steps = 0;
  double pct_start = 0.3;
  bool anneal_cos = true;  // anneal_strategy: true = 'cos', false = 'linear'
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
};
// initial_lr = max_lr / div_factor, min_lr = initial_lr / final_div_factor. Phases end at steps
// pct_start*N - 1 (initial_lr -> max_lr) and N - 1 (-> min_lr); with three_phase at pct_start*N -
// 1, 2*pct_start*N - 2 (-> initial_lr) and N - 1 (-> min_lr). Momentum moves inversely between
// max_momentum and base_momentum. Valid for 0 <= t <= total_steps (torch also allows t = N, which
// extrapolates the last phase); t > total_steps throws, as torch does. A phase that torch would
// divide by zero length on (e.g. pct_start * total_steps == 1) throws at the step torch raises.
Schedule OneCycleLr(const OneCycleOptions& options);

// torch SequentialLR: schedules[i] runs from milestones[i-1] (0 for i = 0), restarted at its own
// step 0: lr(t) = schedules[i].Lr(t - milestones[i-1]) with i = number of milestones <= t.
// Needs milestones.size() == schedules.size() - 1, milestones >= 0 and non-decreasing. It has
// momentum if every part has.
Schedule SequentialLr(std::vector<Schedule> schedules, std::vector<std::int64_t> milestones);

// Linear warmup from warmup_start_factor * base_lr to base_lr over warmup_steps, then cosine
// annealing to min_lr at total_steps: SequentialLr({LinearLr(base_lr, warmup_start_factor, 1,
// warmup_steps), CosineAnnealingLr(base_lr, total_steps - warmup_steps, min_lr)}, {warmup_steps}).
// warmup_steps == 0 gives the cosine alone. The default start factor is LinearLR's (1/3).
// 0 <= warmup_steps < total_steps.
Schedule WarmupCosine(double base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                      double min_lr = 0.0, double warmup_start_factor = 1.0 / 3);

}  // namespace fusedopt
