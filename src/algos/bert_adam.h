// BertAdam (torch_npu NpuFusedBertAdam, a port of HF pytorch-pretrained-bert's BertAdam;
// shared/docs/algorithms-more.md §1.2): the descriptor the engine, the bindings and the tools read.
// Two phases: src/cpu/bert_adam.cc first reduces Σg² of every tensor; FinishAll adds them per
// (group, param dtype), the flat buffers the reference clips one by one, and sets each tensor's
// clip factor; the update pass then runs src/math/bert_adam_math.h.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <span>
#include <string_view>
#include <utility>

#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// BertAdam: the first pass reduces Σ(g·grad_scale)² per tensor, FinishAll sets `clip` from the
// norm of each (group, param dtype); the second pass updates. No bias correction.
struct BertAdamScalars {
  float grad_mul;  // grad_scale (the loss scale's inverse), as the gradient is read
  float clip;      // max_grad_norm / (‖g‖ + 1e-6) of the tensor's buffer when below 1, else 1
  float b1;
  float one_minus_b1;
  float b2;
  float one_minus_b2;
  float e;
  float weight_decay;
  float lr_scheduled;     // lr · schedule(s / t_total, warmup), rounded once
  bool has_weight_decay;  // weight_decay > 0 (the reference's test: a negative one is ignored)
};

// Its kernel (src/cpu/bert_adam.cc), which runs src/math/bert_adam_math.h (src/core/kernels.h says
// what the entry points do).
void RunBertAdamReduceChunk(const StepPlan<BertAdamScalars>& plan, std::size_t chunk, double* sums);
void RunBertAdamChunks(const StepPlan<BertAdamScalars>& plan, std::size_t chunk_begin,
                       std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

// The reference's schedule names, indexed by BertAdamSchedule code.
inline constexpr std::array<std::string_view, 4> kBertAdamScheduleNames = {
    "warmup_linear", "warmup_constant", "warmup_cosine", "warmup_poly"};

// The code of a schedule name, or -1.
inline int BertAdamScheduleCode(std::string_view name) {
  for (std::size_t i = 0; i < kBertAdamScheduleNames.size(); ++i) {
    if (kBertAdamScheduleNames[i] == name) return static_cast<int>(i);
  }
  return -1;
}

// The reference's SCHEDULES at progress x: the factor of lr. Where the reference fails, this does
// what its formula means: warmup −1 ("no warmup") counts as 0, as HF's schedules take it (the NPU
// passes −1 on, which halves warmup_linear's lr: (x − 1) / (−2)); warmup_cosine uses math.cos
// (torch.cos of a float raises TypeError there); warmup_poly is 0 from x = 1 on (the reference's
// (1 − x)**0.5 turns complex after it).
inline double BertAdamScheduleFactor(int schedule, double x, double warmup_fraction) {
  const double warmup = std::max(warmup_fraction, 0.0);
  if (x < warmup) return x / warmup;
  switch (schedule) {
    case kBertAdamWarmupConstant:
      return 1.0;
    case kBertAdamWarmupCosine:
      return 0.5 * (1.0 + std::cos(std::numbers::pi * x));
    case kBertAdamWarmupPoly:
      return x < 1.0 ? std::pow(1.0 - x, 0.5) : 0.0;
    default:  // kBertAdamWarmupLinear
      return std::max((x - 1.0) / (warmup - 1.0), 0.0);
  }
}

// lr_scheduled of the step that follows `steps_before` steps: the schedule reads the step count
// before its increment (0 on the first step), as HF's BertAdam does per param.
inline double BertAdamScheduledLr(const BertAdamHyper& h, std::int64_t steps_before) {
  if (h.t_total == -1.0) return h.lr;
  return h.lr * BertAdamScheduleFactor(h.schedule, static_cast<double>(steps_before) / h.t_total,
                                       h.warmup);
}

struct BertAdam {
  using Hyper = BertAdamHyper;
  using Scalars = BertAdamScalars;
  static constexpr const char* kName = "bert_adam";
  static constexpr const char* kTorchName = "BertAdam";
  static constexpr const char* kStepName = "BertAdamStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_avg_sq", ""};
  static constexpr auto kFields = Fields(
      Field{"lr", &Hyper::lr}, Field{"warmup", &Hyper::warmup}, Field{"t_total", &Hyper::t_total},
      Field{"schedule", &Hyper::schedule}.Choices(kBertAdamScheduleNames), Field{"b1", &Hyper::b1},
      Field{"b2", &Hyper::b2}, Field{"e", &Hyper::e}, Field{"weight_decay", &Hyper::weight_decay},
      Field{"max_grad_norm", &Hyper::max_grad_norm});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // The reference's constructor checks (lr, warmup, schedule, b1, b2, e), and what it leaves
  // unchecked but cannot run: t_total 0 divides by zero, another negative one is no schedule.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    if (!(h.warmup == -1.0 || (h.warmup >= 0.0 && h.warmup < 1.0)))
      c.Reject("invalid warmup: ", h.warmup, " (must be -1 or in [0, 1))");
    if (!(h.t_total == -1.0 || h.t_total > 0.0))
      c.Reject("invalid t_total: ", h.t_total, " (must be -1 or > 0)");
    if (h.schedule < kBertAdamWarmupLinear || h.schedule > kBertAdamWarmupPoly) {
      c.Reject("invalid schedule code: ", h.schedule,
               " (0 warmup_linear, 1 warmup_constant, 2 warmup_cosine, 3 warmup_poly)");
    }
    c.Beta("b1", h.b1);
    c.Beta("b2", h.b2);
    c.AtLeast("e", h.e, 0.0);
    c.Finite("weight_decay", h.weight_decay);
    if (std::isnan(h.max_grad_norm)) c.Reject("invalid max_grad_norm: nan");
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = s.grad_scale,
        .clip = 1.0f,
        .b1 = static_cast<float>(h.b1),
        .one_minus_b1 = static_cast<float>(1.0 - h.b1),
        .b2 = static_cast<float>(h.b2),
        .one_minus_b2 = static_cast<float>(1.0 - h.b2),
        .e = static_cast<float>(h.e),
        .weight_decay = static_cast<float>(h.weight_decay),
        .lr_scheduled = static_cast<float>(BertAdamScheduledLr(h, s.step - 1)),
        .has_weight_decay = h.weight_decay > 0.0,
    };
  }

  // The reduction pass gives Σ(g·grad_scale)² of the tensor: it reads the gradient only (the
  // bench's and the doctor's traffic floor of the pass).
  static constexpr int kReductions = 1;
  static constexpr ReductionReads kReductionReads = ReductionReads::kGrad;
  // Only clipping reads the sums: without it in any group the step is one pass.
  static bool NeedsReduction(const Hyper& h) { return h.max_grad_norm > 0.0; }
  static constexpr auto kReduce = RunBertAdamReduceChunk;
  // The reference's _clip_grad_norm_ per (group, param dtype) buffer: ‖g‖ of the buffer (its
  // tensors' sums added in segment order), c = max_grad_norm / (‖g‖ + 1e-6) in f32 as torch
  // computes it, applied when c < 1 (a NaN norm clips nothing) and max_grad_norm > 0.
  static void FinishAll(std::span<const Hyper> groups, std::span<const Segment> segments,
                        std::span<const double> sums, std::span<Scalars> scalars) {
    std::map<std::pair<std::uint32_t, DType>, double> buffers;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      buffers[{segments[i].group, segments[i].param_dtype}] += sums[i];
    }
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const Hyper& h = groups[segments[i].group];
      if (!(h.max_grad_norm > 0.0)) continue;
      const double norm = std::sqrt(buffers[{segments[i].group, segments[i].param_dtype}]);
      const float c = ClipCoefficient(norm, h.max_grad_norm);
      if (c < 1.0f) scalars[i].clip = c;
    }
  }

  static constexpr auto kRun = RunBertAdamChunks;

  // NpuFusedBertAdam._group_step (with _clip_grad_norm_), one tensor op per line (descriptor.h),
  // over the group's tensors: first the gradient norm of the group (its tensors' norms, squared and
  // summed; `step` holds one dtype), then each tensor's update with the clipped gradient as a new
  // tensor (the reference scales its flat gradient buffer in place: the same traffic, and the
  // callers' gradients stay as they were).
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    float clip = 1.0f;
    if (h.max_grad_norm > 0.0) {  // if self.max_grad_norm > 0: _clip_grad_norm_(...)
      double total = 0.0;
      step.ForEachTensor([&](auto& t) {
        const double norm = t.norm(t.grad());  // total_norm = grad.float().abs().pow(2).sum()...
        total += norm * norm;
      });
      const float c = ClipCoefficient(std::sqrt(total), h.max_grad_norm);  // max / (norm + 1e-6)
      if (c < 1.0f) clip = c;                                              // if clip_coef < 1
    }
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      // combined_grad.mul_(clip_coef) where c < 1; the sequence may not depend on the values (the
      // doctor counts it without any), so it always scales (by exactly 1 when c >= 1).
      if (h.max_grad_norm > 0.0) grad = t.mul(grad, clip);
      const auto exp_avg = t.state(kBertAdamExpAvg);
      const auto exp_avg_sq = t.state(kBertAdamExpAvgSq);
      t.mul_(exp_avg, h.b1);                           // exp_avg.mul_(beta1)
      t.add_(exp_avg, grad, 1.0 - h.b1);               //   .add_(1 - beta1, combined_grad)
      t.mul_(exp_avg_sq, h.b2);                        // exp_avg_sq.mul_(beta2)
      t.addcmul_(exp_avg_sq, grad, grad, 1.0 - h.b2);  //   .addcmul_(1 - beta2, grad, grad)
      auto denom = t.sqrt(exp_avg_sq);                 // update = exp_avg / (exp_avg_sq.sqrt()
      t.add_(denom, h.e);                              //   + e)
      const auto update = t.div(exp_avg, denom);
      if (h.weight_decay > 0.0) {
        const auto decay = t.mul(t.param(), h.weight_decay);  // weight_decay * param.data
        t.add_(update, decay, 1.0);                           // update += ...
      }
      const double lr_scheduled = BertAdamScheduledLr(h, t.step() - 1);
      const auto scaled = t.mul(update, lr_scheduled);  // update_with_lr = lr_scheduled * update
      const auto negated = t.neg(scaled);               // -update_with_lr
      t.add_(t.param(), negated, 1.0);                  // param.data.add_(...)
    });
  }
};

}  // namespace fusedopt::algos
