// Closed forms of torch.optim.lr_scheduler (torch 2.13). Each expression is written in the order of
// torch's own `_get_closed_form_lr` (or OneCycleLR.get_lr), so it rounds as torch's closed form
// does; SequentialLR evaluates that closed form at each milestone, so those lrs match bit for bit.
#include "fusedopt/schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusedopt/error.h"
#include "src/core/validate.h"

namespace fusedopt {

struct Schedule::Impl {
  std::string description;
  std::string name;  // description up to '(' (for error messages)
  Fn lr;
  Fn momentum;  // empty: no momentum
};

namespace {

// Shortest text that reads back as the same double (as Python's repr).
std::string Repr(double x) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

std::string ListText(const std::vector<std::int64_t>& values) {
  std::string list = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) list += ", ";
    list += std::to_string(values[i]);
  }
  return list + "]";
}

// Builds "Name(a=1, b=0.5)".
class Describer {
 public:
  explicit Describer(std::string_view name) : text_(name) { text_ += '('; }
  Describer& Add(std::string_view key, double value) { return Put(key, Repr(value)); }
  Describer& Add(std::string_view key, std::int64_t value) {
    return Put(key, std::to_string(value));
  }
  Describer& Add(std::string_view key, bool value) { return Put(key, value ? "true" : "false"); }
  Describer& Add(std::string_view key, const std::vector<std::int64_t>& values) {
    return Put(key, ListText(values));
  }
  Describer& AddText(std::string_view key, std::string_view text) { return Put(key, text); }
  std::string str() const { return text_ + ')'; }

 private:
  Describer& Put(std::string_view key, std::string_view value) {
    if (text_.back() != '(') text_ += ", ";
    text_.append(key).append("=").append(value);
    return *this;
  }
  std::string text_;
};

// `!(x >= lo)` also rejects NaN.
void RequireLr(std::string_view fn, const char* name, double value) {
  if (!(value >= 0.0 && std::isfinite(value)))
    Fail(fn, "invalid ", name, ": ", value, " (must be finite and >= 0)");
}
void RequireFinite(std::string_view fn, const char* name, double value) {
  if (!std::isfinite(value)) Fail(fn, "invalid ", name, ": ", value, " (must be finite)");
}
void RequirePositive(std::string_view fn, const char* name, std::int64_t value) {
  if (value <= 0) Fail(fn, "invalid ", name, ": ", value, " (must be > 0)");
}
void RequirePositive(std::string_view fn, const char* name, double value) {
  if (!(value > 0.0 && std::isfinite(value)))
    Fail(fn, "invalid ", name, ": ", value, " (must be finite and > 0)");
}
// lo <= value <= hi, or lo < value <= hi when open_low.
void RequireIn(std::string_view fn, const char* name, double value, double lo, double hi,
               bool open_low = false) {
  const bool ok = (open_low ? value > lo : value >= lo) && value <= hi;
  if (!ok) {
    Fail(fn, "invalid ", name, ": ", value, " (must be in ", open_low ? "(" : "[", lo, ", ", hi,
         "])");
  }
}
void RequireMilestones(std::string_view fn, const std::vector<std::int64_t>& milestones) {
  for (std::size_t i = 0; i < milestones.size(); ++i) {
    if (milestones[i] < 0) Fail(fn, "invalid milestones[", i, "]: ", milestones[i], " (< 0)");
    if (i > 0 && milestones[i] < milestones[i - 1]) {
      Fail(fn, "invalid milestones[", i, "]: ", milestones[i], " (less than milestones[", i - 1,
           "] = ", milestones[i - 1], "; milestones must be non-decreasing)");
    }
  }
}

// Number of milestones <= t (Python's bisect_right).
std::int64_t CountReached(const std::vector<std::int64_t>& milestones, std::int64_t t) {
  return std::upper_bound(milestones.begin(), milestones.end(), t) - milestones.begin();
}

}  // namespace

Schedule::Schedule(std::string description, Fn lr, Fn momentum) {
  if (!lr) throw Error("Schedule: no lr function given");
  std::string name = description.substr(0, description.find('('));
  impl_ = std::make_shared<const Impl>(
      Impl{std::move(description), std::move(name), std::move(lr), std::move(momentum)});
}

double Schedule::Lr(std::int64_t step) const {
  if (step < 0) Fail(impl_->name, "invalid step: ", step, " (must be >= 0)");
  return impl_->lr(step);
}

bool Schedule::has_momentum() const { return static_cast<bool>(impl_->momentum); }

double Schedule::Momentum(std::int64_t step) const {
  if (!has_momentum()) Fail(impl_->name, "this schedule has no momentum");
  if (step < 0) Fail(impl_->name, "invalid step: ", step, " (must be >= 0)");
  return impl_->momentum(step);
}

const std::string& Schedule::Describe() const { return impl_->description; }

Schedule ConstantSchedule(double lr) {
  RequireLr("ConstantSchedule", "lr", lr);
  return Schedule(Describer("ConstantSchedule").Add("lr", lr).str(),
                  [lr](std::int64_t) { return lr; });
}

Schedule ConstantLr(double base_lr, double factor, std::int64_t total_iters) {
  constexpr std::string_view kFn = "ConstantLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequireIn(kFn, "factor", factor, 0.0, 1.0);
  RequirePositive(kFn, "total_iters", total_iters);
  return Schedule(Describer(kFn)
                      .Add("base_lr", base_lr)
                      .Add("factor", factor)
                      .Add("total_iters", total_iters)
                      .str(),
                  [=](std::int64_t t) {
                    // ConstantLR: base_lr * (factor + (t >= total_iters) * (1 - factor))
                    return base_lr * (factor + (t >= total_iters ? 1.0 - factor : 0.0));
                  });
}

Schedule LinearLr(double base_lr, double start_factor, double end_factor,
                  std::int64_t total_iters) {
  constexpr std::string_view kFn = "LinearLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequireIn(kFn, "start_factor", start_factor, 0.0, 1.0, /*open_low=*/true);
  RequireIn(kFn, "end_factor", end_factor, 0.0, 1.0);
  RequirePositive(kFn, "total_iters", total_iters);
  return Schedule(Describer(kFn)
                      .Add("base_lr", base_lr)
                      .Add("start_factor", start_factor)
                      .Add("end_factor", end_factor)
                      .Add("total_iters", total_iters)
                      .str(),
                  [=](std::int64_t t) {
                    // LinearLR: base_lr * (start_factor + (end_factor - start_factor)
                    //                                      * min(total_iters, t) / total_iters)
                    const double done = static_cast<double>(std::min(total_iters, t));
                    return base_lr * (start_factor + (end_factor - start_factor) * done /
                                                         static_cast<double>(total_iters));
                  });
}

Schedule CosineAnnealingLr(double base_lr, std::int64_t t_max, double eta_min) {
  constexpr std::string_view kFn = "CosineAnnealingLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequirePositive(kFn, "T_max", t_max);
  RequireLr(kFn, "eta_min", eta_min);
  return Schedule(
      Describer(kFn).Add("base_lr", base_lr).Add("T_max", t_max).Add("eta_min", eta_min).str(),
      [=](std::int64_t t) {
        // CosineAnnealingLR: eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2
        const double angle = std::numbers::pi * static_cast<double>(t) / static_cast<double>(t_max);
        return eta_min + (base_lr - eta_min) * (1.0 + std::cos(angle)) / 2.0;
      });
}

Schedule StepLr(double base_lr, std::int64_t step_size, double gamma) {
  constexpr std::string_view kFn = "StepLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequirePositive(kFn, "step_size", step_size);
  RequireLr(kFn, "gamma", gamma);
  return Schedule(
      Describer(kFn).Add("base_lr", base_lr).Add("step_size", step_size).Add("gamma", gamma).str(),
      [=](std::int64_t t) {
        // StepLR: base_lr * gamma ** (t // step_size)
        // NOLINTNEXTLINE(bugprone-integer-division): torch's t // step_size, in integers
        return base_lr * std::pow(gamma, static_cast<double>(t / step_size));
      });
}

Schedule MultiStepLr(double base_lr, std::vector<std::int64_t> milestones, double gamma) {
  constexpr std::string_view kFn = "MultiStepLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequireMilestones(kFn, milestones);
  RequireLr(kFn, "gamma", gamma);
  std::string description = Describer(kFn)
                                .Add("base_lr", base_lr)
                                .Add("milestones", milestones)
                                .Add("gamma", gamma)
                                .str();
  return Schedule(std::move(description), [=, milestones = std::move(milestones)](std::int64_t t) {
    // MultiStepLR: base_lr * gamma ** bisect_right(milestones, t)
    return base_lr * std::pow(gamma, static_cast<double>(CountReached(milestones, t)));
  });
}

Schedule ExponentialLr(double base_lr, double gamma) {
  constexpr std::string_view kFn = "ExponentialLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequireLr(kFn, "gamma", gamma);
  return Schedule(Describer(kFn).Add("base_lr", base_lr).Add("gamma", gamma).str(),
                  [=](std::int64_t t) {
                    // ExponentialLR: base_lr * gamma ** t
                    return base_lr * std::pow(gamma, static_cast<double>(t));
                  });
}

Schedule PolynomialLr(double base_lr, std::int64_t total_iters, double power) {
  constexpr std::string_view kFn = "PolynomialLr";
  RequireLr(kFn, "base_lr", base_lr);
  RequirePositive(kFn, "total_iters", total_iters);
  RequireLr(kFn, "power", power);
  return Schedule(Describer(kFn)
                      .Add("base_lr", base_lr)
                      .Add("total_iters", total_iters)
                      .Add("power", power)
                      .str(),
                  [=](std::int64_t t) {
                    // PolynomialLR: base_lr * (1 - min(total_iters, t) / total_iters) ** power
                    const double done = static_cast<double>(std::min(total_iters, t)) /
                                        static_cast<double>(total_iters);
                    return base_lr * std::pow(1.0 - done, power);
                  });
}

namespace {

// One phase of OneCycleLR (torch's _schedule_phases entry, values resolved).
struct OneCyclePhase {
  double end_step;
  double start_lr, end_lr;
  double start_momentum, end_momentum;
};

class OneCycle {
 public:
  explicit OneCycle(const OneCycleOptions& o) : o_(o) {
    const double n = static_cast<double>(o.total_steps);
    const double initial_lr = o.max_lr / o.div_factor;         // group["initial_lr"]
    const double min_lr = initial_lr / o.final_div_factor;     // group["min_lr"]
    const double mx = o.max_momentum, base = o.base_momentum;  // max_momentum, base_momentum
    if (o.three_phase) {
      phases_ = {{o.pct_start * n - 1.0, initial_lr, o.max_lr, mx, base},
                 {2.0 * o.pct_start * n - 2.0, o.max_lr, initial_lr, base, mx},
                 {n - 1.0, initial_lr, min_lr, mx, mx}};
    } else {
      phases_ = {{o.pct_start * n - 1.0, initial_lr, o.max_lr, mx, base},
                 {n - 1.0, o.max_lr, min_lr, base, mx}};
    }
  }

  double Lr(std::int64_t t) const { return Eval(t, /*momentum=*/false); }
  double Momentum(std::int64_t t) const { return Eval(t, /*momentum=*/true); }

 private:
  // OneCycleLR._annealing_cos: end + (start - end) / 2 * (cos(pi * pct) + 1);
  // _annealing_linear: (end - start) * pct + start.
  double Anneal(double start, double end, double pct) const {
    if (o_.anneal_cos) return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
    return (end - start) * pct + start;
  }

  // OneCycleLR.get_lr: the first phase with t <= end_step (or the last one), and
  // pct = (t - start_step) / (end_step - start_step), start_step = the previous phase's end (0).
  double Eval(std::int64_t t, bool momentum) const {
    if (t > o_.total_steps) {
      Fail("OneCycleLr", "invalid step: ", t, " (past total_steps = ", o_.total_steps, ")");
    }
    const double step = static_cast<double>(t);
    double start_step = 0.0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const OneCyclePhase& p = phases_[i];
      if (step <= p.end_step || i + 1 == phases_.size()) {
        if (p.end_step == start_step) {  // torch raises ZeroDivisionError here
          Fail("OneCycleLr", "step ", t, " falls in phase ", i,
               ", which has zero length (pct_start ", o_.pct_start, ", total_steps ",
               o_.total_steps, ")");
        }
        const double pct = (step - start_step) / (p.end_step - start_step);
        return momentum ? Anneal(p.start_momentum, p.end_momentum, pct)
                        : Anneal(p.start_lr, p.end_lr, pct);
      }
      start_step = p.end_step;
    }
    return 0.0;  // unreachable: the last phase always matches
  }

  OneCycleOptions o_;
  std::vector<OneCyclePhase> phases_;
};

}  // namespace

Schedule OneCycleLr(const OneCycleOptions& o) {
  constexpr std::string_view kFn = "OneCycleLr";
  RequireLr(kFn, "max_lr", o.max_lr);
  RequirePositive(kFn, "total_steps", o.total_steps);
  RequireIn(kFn, "pct_start", o.pct_start, 0.0, 1.0);
  RequirePositive(kFn, "div_factor", o.div_factor);
  RequirePositive(kFn, "final_div_factor", o.final_div_factor);
  if (o.cycle_momentum) {
    RequireFinite(kFn, "base_momentum", o.base_momentum);
    RequireFinite(kFn, "max_momentum", o.max_momentum);
  }
  Describer d(kFn);
  d.Add("max_lr", o.max_lr)
      .Add("total_steps", o.total_steps)
      .Add("pct_start", o.pct_start)
      .AddText("anneal_strategy", o.anneal_cos ? "'cos'" : "'linear'")
      .Add("div_factor", o.div_factor)
      .Add("final_div_factor", o.final_div_factor)
      .Add("three_phase", o.three_phase)
      .Add("cycle_momentum", o.cycle_momentum);
  if (o.cycle_momentum) d.Add("base_momentum", o.base_momentum).Add("max_momentum", o.max_momentum);
  auto cycle = std::make_shared<const OneCycle>(o);
  cycle->Lr(0);  // torch evaluates step 0 in its constructor (and raises there if it must)
  Schedule::Fn momentum;
  if (o.cycle_momentum) momentum = [cycle](std::int64_t t) { return cycle->Momentum(t); };
  return Schedule(
      d.str(), [cycle](std::int64_t t) { return cycle->Lr(t); }, std::move(momentum));
}

Schedule SequentialLr(std::vector<Schedule> schedules, std::vector<std::int64_t> milestones) {
  constexpr std::string_view kFn = "SequentialLr";
  if (schedules.empty()) Fail(kFn, "needs at least one schedule");
  if (milestones.size() + 1 != schedules.size()) {
    Fail(kFn, "needs one milestone fewer than schedules, got ", schedules.size(), " schedules and ",
         milestones.size(), " milestones");
  }
  RequireMilestones(kFn, milestones);
  std::string description = "SequentialLr(schedules=[";
  bool momentum = true;
  for (std::size_t i = 0; i < schedules.size(); ++i) {
    description += (i > 0 ? ", " : "") + schedules[i].Describe();
    momentum = momentum && schedules[i].has_momentum();
  }
  description += "], milestones=" + ListText(milestones) + ")";

  // SequentialLR.step: i = bisect_right(milestones, t); at t == milestones[i-1] it calls
  // schedulers[i].step(0) (closed form at 0), and steps it once per call after that.
  auto parts = std::make_shared<const std::pair<std::vector<Schedule>, std::vector<std::int64_t>>>(
      std::move(schedules), std::move(milestones));
  auto locate = [parts](std::int64_t t) {
    const auto& [scheds, stones] = *parts;
    const std::int64_t i = CountReached(stones, t);
    return std::pair<const Schedule&, std::int64_t>(scheds[i], i == 0 ? t : t - stones[i - 1]);
  };
  Schedule::Fn momentum_fn;
  if (momentum) {
    momentum_fn = [locate](std::int64_t t) {
      const auto [s, local] = locate(t);
      return s.Momentum(local);
    };
  }
  return Schedule(
      std::move(description),
      [locate](std::int64_t t) {
        const auto [s, local] = locate(t);
        return s.Lr(local);
      },
      std::move(momentum_fn));
}

Schedule WarmupCosine(double base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                      double min_lr, double warmup_start_factor) {
  constexpr std::string_view kFn = "WarmupCosine";
  if (warmup_steps < 0) Fail(kFn, "invalid warmup_steps: ", warmup_steps, " (must be >= 0)");
  if (total_steps <= warmup_steps) {
    Fail(kFn, "invalid total_steps: ", total_steps, " (must be > warmup_steps = ", warmup_steps,
         ")");
  }
  RequireLr(kFn, "base_lr", base_lr);
  RequireLr(kFn, "min_lr", min_lr);
  RequireIn(kFn, "warmup_start_factor", warmup_start_factor, 0.0, 1.0, /*open_low=*/true);
  const Schedule cosine = CosineAnnealingLr(base_lr, total_steps - warmup_steps, min_lr);
  const Schedule whole =
      warmup_steps == 0
          ? cosine
          : SequentialLr({LinearLr(base_lr, warmup_start_factor, 1.0, warmup_steps), cosine},
                         {warmup_steps});
  return Schedule(Describer(kFn)
                      .Add("base_lr", base_lr)
                      .Add("warmup_steps", warmup_steps)
                      .Add("total_steps", total_steps)
                      .Add("min_lr", min_lr)
                      .Add("warmup_start_factor", warmup_start_factor)
                      .str(),
                  [whole](std::int64_t t) { return whole.Lr(t); });
}

}  // namespace fusedopt
