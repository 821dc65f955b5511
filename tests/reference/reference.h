// Test-only oracle: torch.optim's single-tensor update rules (shared/docs/torch-semantics.md §3,
// torch 2.x) as plain per-element loops in double. It shares no code with src/math: it is written
// from the torch docs and code, so a kernel and the oracle agreeing means something.
// Hyper-parameters are used exactly as given (no rounding of scalars to f32), so the same functions
// reproduce torch's float64 path.
//
// Each function performs one step of one tensor in place. `step` is that tensor's step counter
// after the increment, as torch's state['step'] (1 on its first update). State spans a rule does
// not use under the given hyper-parameters may be empty.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "fusedopt/hyper.h"

namespace fusedopt::ref {

// torch.maximum: NaN if either input is NaN.
inline double MaximumPropagatingNaN(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? b : a;
}

// torch.optim.SGD. `momentum_buffer` is used when momentum != 0; at step 1 it is (re)started.
inline void SgdStep(const SgdHyper& h, std::int64_t step, std::span<double> p,
                    std::span<const double> g, std::span<double> momentum_buffer) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double d = h.maximize ? -g[i] : g[i];                   // d = -g if maximize else g
    if (h.weight_decay != 0.0) d += h.weight_decay * p[i];  // d = d + λθ
    if (h.momentum != 0.0) {
      double& b = momentum_buffer[i];
      if (step == 1) {
        b = d;  // b_1 = d (clone of the gradient, no dampening)
      } else {
        b = h.momentum * b + (1.0 - h.dampening) * d;  // b_t = μ b_{t-1} + (1 − τ) d
      }
      d = h.nesterov ? d + h.momentum * b : b;  // d = d + μ b_t (nesterov) | d = b_t
    }
    p[i] -= h.lr * d;  // θ = θ − γ d
  }
}

// torch.optim.Adam; with decoupled_weight_decay, torch.optim.AdamW. `max_exp_avg_sq` is used with
// amsgrad.
inline void AdamStep(const AdamHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> exp_avg,
                     std::span<double> exp_avg_sq, std::span<double> max_exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);        // bc1 = 1 − β1^t
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);        // bc2 = 1 − β2^t
  const double step_size = h.lr / bias_correction1;                  // γ / bc1
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);  // √bc2
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.decoupled_weight_decay) {
      p[i] *= 1.0 - h.lr * h.weight_decay;  // AdamW: θ = θ (1 − γλ)
    } else if (h.weight_decay != 0.0) {
      gi += h.weight_decay * p[i];  // Adam: g = g + λθ
    }
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m += (1.0 - h.beta1) * (gi - m);  // m = lerp(m, g, 1 − β1) = β1 m + (1 − β1) g
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;  // v = β2 v + (1 − β2) g²
    double second = v;                            // v, or with amsgrad:
    if (h.amsgrad) {
      max_exp_avg_sq[i] =
          MaximumPropagatingNaN(max_exp_avg_sq[i], v);  // v_max = max(v_max, v) (raw v)
      second = max_exp_avg_sq[i];
    }
    const double denom =
        std::sqrt(second) / bias_correction2_sqrt + h.eps;  // denom = √v / √bc2 + ε
    p[i] -= step_size * m / denom;                          // θ = θ − (γ / bc1) m / denom
  }
}

// torch.optim.RMSprop (eps outside the sqrt). `momentum_buffer` is used when momentum > 0,
// `grad_avg` when centered.
inline void RmspropStep(const RmspropHyper& h, std::int64_t /*step*/, std::span<double> p,
                        std::span<const double> g, std::span<double> square_avg,
                        std::span<double> momentum_buffer, std::span<double> grad_avg) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λθ
    double& v = square_avg[i];
    v = h.alpha * v + (1.0 - h.alpha) * gi * gi;  // v = α v + (1 − α) g²
    double avg;
    if (h.centered) {
      double& ga = grad_avg[i];
      ga += (1.0 - h.alpha) * (gi - ga);  // ḡ = lerp(ḡ, g, 1 − α) = α ḡ + (1 − α) g
      avg = std::sqrt(v - ga * ga);       // √(v − ḡ²)
    } else {
      avg = std::sqrt(v);  // √v
    }
    avg += h.eps;  // avg = √(…) + ε
    if (h.momentum > 0.0) {
      double& b = momentum_buffer[i];
      b = h.momentum * b + gi / avg;  // b = μ b + g / avg
      p[i] -= h.lr * b;               // θ = θ − γ b
    } else {
      p[i] -= h.lr * gi / avg;  // θ = θ − γ g / avg
    }
  }
}

// torch.optim.Adagrad (dense). `sum` must hold initial_accumulator_value before the first step.
inline void AdagradStep(const AdagradHyper& h, std::int64_t step, std::span<double> p,
                        std::span<const double> g, std::span<double> sum) {
  const double clr =
      h.lr / (1.0 + static_cast<double>(step - 1) * h.lr_decay);  // γ̃ = γ / (1 + (t − 1) η)
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0)
      gi += h.weight_decay * p[i];                   // g = g + λθ (used in both lines below)
    sum[i] += gi * gi;                               // G = G + g²
    p[i] -= clr * gi / (std::sqrt(sum[i]) + h.eps);  // θ = θ − γ̃ g / (√G + ε)
  }
}

}  // namespace fusedopt::ref
