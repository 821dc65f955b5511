// ASGD (torch.optim.ASGD: lambd, alpha, t0, weight_decay, maximize): the descriptor the engine,
// the bindings and the tools read. The update rule is src/math/asgd_math.h, run by
// src/cpu/asgd.cc. Its per-tensor scalar states eta and mu (Segment::scalars) are advanced here.
#pragma once

#include <cmath>
#include <span>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// ASGD's coefficients come from the eta and mu the previous step left (Segment::scalars).
struct AsgdScalars {
  float grad_mul;
  float weight_decay;  // L2 term, used when has_weight_decay
  float decay_mul;     // f32(1 − lambd·eta)
  float neg_eta;       // −eta
  float mu;            // the averaging weight, used when average
  bool has_weight_decay;
  bool average;  // mu != 1: ax += mu·(p − ax); else ax = p
};

// Its kernel (src/cpu/asgd.cc), which runs src/math/asgd_math.h (src/core/kernels.h says what the
// entry points do).
void RunAsgdChunks(const StepPlan<AsgdScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Asgd {
  using Hyper = AsgdHyper;
  using Scalars = AsgdScalars;
  static constexpr const char* kName = "asgd";
  static constexpr const char* kTorchName = "ASGD";
  // `fusedopt bench` and the doctor: t0 -1, so that ax averages (reads and writes ax) from step 2
  // on. With torch's t0 1e6, ax is a copy of the param for the first million steps, which the fused
  // step writes without reading it (4/5 of the bytes).
  static Hyper BenchHyper() { return {.t0 = -1.0}; }
  static constexpr const char* kStepName = "AsgdStep";
  static constexpr StateNames kStates = {"ax", "", ""};
  static constexpr std::array<const char*, 2> kScalarStates = {"eta", "mu"};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"lambd", &Hyper::lambd}, Field{"alpha", &Hyper::alpha},
             Field{"t0", &Hyper::t0}, Field{"weight_decay", &Hyper::weight_decay},
             Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b001u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }
  // torch: state['eta'] = torch.as_tensor(lr, dtype=float32), state['mu'] = torch.ones(())
  static float InitialScalar(const Hyper& h, int k) {
    return k == kAsgdEta ? static_cast<float>(h.lr) : 1.0f;
  }

  // torch's constructor checks (lambd, alpha and t0 have none), which a schedule or a group edit
  // may break later.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  // The eta and mu that step t leaves (asgd.py 271-274), in double as Python evaluates them and
  // rounded to f32 once by torch.as_tensor: lr / ((1 + lambd * lr * step) ** alpha) and
  // 1 / max(1, step - t0). Step 0's values are the initial ones (f32(lr) and 1).
  static float EtaAfter(const Hyper& h, double t) {
    return static_cast<float>(h.lr / std::pow(1.0 + h.lambd * h.lr * t, h.alpha));
  }
  static float MuAfter(const Hyper& h, double t) {
    const double d = t - h.t0;  // Python's max(1, d) is 1 unless d > 1 (NaN included)
    return d > 1.0 ? static_cast<float>(1.0 / d) : 1.0f;
  }

  static void NextScalars(const Hyper& h, const Segment& s, std::span<float, 2> next) {
    const auto t = static_cast<double>(s.step);
    next[kAsgdEta] = EtaAfter(h, t);
    next[kAsgdMu] = MuAfter(h, t);
  }

  // The update reads the values the previous step left, the old ones in s.scalars.
  static Scalars MakeScalars(const Hyper& h, const Segment& s, std::span<const float, 2> /*next*/) {
    const double eta = *s.scalars[kAsgdEta];  // eta.item()
    const float mu = *s.scalars[kAsgdMu];
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .decay_mul = static_cast<float>(1.0 - h.lambd * eta),  // 1 - lambd * eta_value
        .neg_eta = static_cast<float>(-eta),                   // alpha=-eta_value
        .mu = mu,
        .has_weight_decay = h.weight_decay != 0.0,
        .average = mu != 1.0f,  // mu.item() != 1
    };
  }

  static constexpr auto kRun = RunAsgdChunks;

  // torch/optim/asgd.py (torch 2.13), _single_tensor_asgd (capturable=False), one tensor op per
  // line (descriptor.h). step_t += 1 (247) and the eta and mu updates (271-274) are 0-d host
  // updates: the eta and mu a step reads are rebuilt here from the step, as the previous step left
  // them.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 220: grad = grad if not maximize else -grad
      if (h.weight_decay != 0.0)
        grad = t.add(grad, t.param(), h.weight_decay);  // 250: grad.add(param, alpha=wd)
      const auto before = static_cast<double>(t.step() - 1);
      const double eta = EtaAfter(h, before);  // 256: eta_value = _get_value(eta)
      const double mu = MuAfter(h, before);
      t.mul_(t.param(), 1.0 - h.lambd * eta);  // 257: param.mul_(1 - lambd * eta_value)
      t.add_(t.param(), grad, -eta);           // 258: param.add_(grad, alpha=-eta_value)
      const auto ax = t.state(kAsgdAx);
      if (mu != 1.0) {                                 // 261: if mu.item() != 1
        const auto diff = t.add(t.param(), ax, -1.0);  // 262: param.sub(ax)
        t.mul_(diff, mu);                              //   .mul_(mu)
        t.add_(ax, diff, 1.0);                         //   ax.add_(...)
      } else {
        t.copy_(ax, t.param());  // 264: ax.copy_(param)
      }
    });
  }
};

}  // namespace fusedopt::algos
