// LAMB (apex FusedLAMB's formulas, shared/docs/algorithms-more.md §3.1): the descriptor the engine,
// the bindings and the tools read. Two phases: src/cpu/lamb.cc first reduces ‖p‖² and ‖u‖² of
// every tensor (u: its Adam update), then applies p −= ratio·u with the trust ratio from Finish.
// The math is src/math/lamb_math.h.
#pragma once

#include <cmath>
#include <span>

#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// The first pass of LAMB reduces ‖p‖² and ‖u‖² per tensor; the second applies p −= ratio·u with
// ratio from those norms (Lamb::Finish fills neg_ratio in between).
struct LambScalars {
  float grad_mul;  // grad_scale: the loss-scale and clip factors, applied as the gradient is read
  float weight_decay;
  float beta1;
  float beta3;  // 1 − beta1 with grad_averaging, else 1
  float beta2;
  float one_minus_beta2;
  float bias_correction1;  // 1 with bias_correction off
  float bias_correction2;
  float eps;
  float neg_ratio;  // −lr·‖p‖/‖u‖ (trust ratio) or −lr, set after the reduction pass
  bool l2_weight_decay;         // wd added to the gradient (adam_w_mode off, wd != 0)
  bool decoupled_weight_decay;  // wd·p added to the update (adam_w_mode on, wd != 0)
};

// Its kernel (src/cpu/lamb.cc), which runs src/math/lamb_math.h (src/core/kernels.h says what the
// entry points do).
void RunLambReduceChunk(const StepPlan<LambScalars>& plan, std::size_t chunk, double* sums);
void RunLambChunks(const StepPlan<LambScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Lamb {
  using Hyper = LambHyper;
  using Scalars = LambScalars;
  static constexpr const char* kName = "lamb";
  static constexpr const char* kTorchName = "LAMB";
  static constexpr const char* kStepName = "LambStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_avg_sq", ""};
  static constexpr auto kFields = Fields(
      Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
      Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
      Field{"weight_decay", &Hyper::weight_decay},
      Field{"bias_correction", &Hyper::bias_correction}, Field{"adam_w_mode", &Hyper::adam_w_mode},
      Field{"grad_averaging", &Hyper::grad_averaging}, Field{"use_nvlamb", &Hyper::use_nvlamb});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.Beta("beta1", h.beta1);
    c.Beta("beta2", h.beta2);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const auto t = static_cast<double>(s.step);
    const bool wd = h.weight_decay != 0.0;
    return {
        .grad_mul = s.grad_scale,
        .weight_decay = static_cast<float>(h.weight_decay),
        .beta1 = static_cast<float>(h.beta1),
        .beta3 = static_cast<float>(h.grad_averaging ? 1.0 - h.beta1 : 1.0),
        .beta2 = static_cast<float>(h.beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
        .bias_correction1 =
            static_cast<float>(h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0),
        .bias_correction2 =
            static_cast<float>(h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0),
        .eps = static_cast<float>(h.eps),
        .neg_ratio = static_cast<float>(-h.lr),
        .l2_weight_decay = !h.adam_w_mode && wd,
        .decoupled_weight_decay = h.adam_w_mode && wd,
    };
  }

  // The reduction pass gives Σp² and Σu² of the tensor (u: the update before the trust ratio).
  static constexpr int kReductions = 2;
  static constexpr auto kReduce = RunLambReduceChunk;
  // ratio = lr·‖p‖/‖u‖ where weight decay is on (or use_nvlamb) and both norms are non-zero, else
  // lr: apex's rule, so biases and norms without decay take a plain Adam step.
  static void Finish(const Hyper& h, const Segment& /*s*/, std::span<const double, 2> sums,
                     Scalars& scalars) {
    const double param_norm = std::sqrt(sums[0]);
    const double update_norm = std::sqrt(sums[1]);
    const bool trust =
        (h.use_nvlamb || h.weight_decay != 0.0) && param_norm != 0.0 && update_norm != 0.0;
    scalars.neg_ratio = static_cast<float>(-(trust ? h.lr * (param_norm / update_norm) : h.lr));
  }

  static constexpr auto kRun = RunLambChunks;

  // tools/lamb_reference.py's step(), one tensor op per line (descriptor.h), a new tensor where the
  // reference makes one: first the global gradient norm over every tensor, before any update (the
  // squares of the tensors' norms summed in double), then each tensor's update with its own two
  // norms, the trust ratio computed on the host as Finish does.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& o, Step& step) {
    double total = 0.0;
    step.ForEachTensor([&](auto& t) {
      const double norm = t.norm(t.grad());  // 100: total += (p.grad.double() ** 2).sum()
      total += norm * norm;
    });
    // 101-105: coef = max_grad_norm / grad_norm if grad_norm > max_grad_norm (else no clipping)
    const float coef = LambClipCoefficient(std::sqrt(total), o.max_grad_norm);
    const bool wd = h.weight_decay != 0.0;
    const double beta3 = h.grad_averaging ? 1.0 - h.beta1 : 1.0;  // 112
    step.ForEachTensor([&](auto& t) {
      // 126: sg = torch.mul(g, coef) if coef is not None else g.clone()
      auto sg = coef != 1.0f ? t.mul(t.grad(), coef) : t.clone(t.grad());
      if (!h.adam_w_mode && wd) sg = t.add(sg, t.param(), h.weight_decay);  // 128: sg.add(p, wd)
      const auto exp_avg = t.state(kLambExpAvg);
      const auto exp_avg_sq = t.state(kLambExpAvgSq);
      t.mul_(exp_avg, h.beta1);                       // 129: exp_avg.mul_(beta1)
      t.add_(exp_avg, sg, beta3);                     //   .add_(sg, alpha=beta3)
      t.mul_(exp_avg_sq, h.beta2);                    // 130: exp_avg_sq.mul_(beta2)
      t.addcmul_(exp_avg_sq, sg, sg, 1.0 - h.beta2);  //   .addcmul_(sg, sg, value=1 - beta2)
      const auto step_t = static_cast<double>(t.step());
      const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, step_t) : 1.0;  // 131-135
      const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, step_t) : 1.0;
      // 136: u = (exp_avg / bc1) / ((exp_avg_sq / bc2).sqrt() + eps)
      const auto m_hat = t.div(exp_avg, bc1);                         // exp_avg / bc1
      auto denom = t.div(exp_avg_sq, bc2);                            // exp_avg_sq / bc2
      denom = t.sqrt(denom);                                          //   .sqrt()
      denom = t.add(denom, h.eps);                                    //   + eps
      const auto u = t.div(m_hat, denom);                             // u = ... / ...
      if (h.adam_w_mode && wd) t.add_(u, t.param(), h.weight_decay);  // 138: u.add_(p, alpha=wd)
      const double param_norm = t.norm(t.param());                    // 140: pn = p.norm()
      const double update_norm = t.norm(u);                           // 141: un = u.norm()
      // 142-145: ratio = lr * (pn / un) if (use_nvlamb or wd != 0) and pn != 0 and un != 0
      const bool trust = (h.use_nvlamb || wd) && param_norm != 0.0 && update_norm != 0.0;
      const double ratio = trust ? h.lr * (param_norm / update_norm) : h.lr;
      t.add_(t.param(), u, -ratio);  // 146: p.add_(u, alpha=-ratio)
    });
  }
};

}  // namespace fusedopt::algos
