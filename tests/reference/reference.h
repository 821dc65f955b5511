// Test-only oracle: torch.optim's single-tensor update rules (shared/docs/torch-semantics.md §3,
// torch 2.x; Adamax and Adadelta: shared/docs/algorithms-more.md §2), lion-pytorch's Lion and apex
// FusedLAMB's LAMB, apex LARC's LARS around SGD, clovaai's AdamP and torch.optim.Adafactor
// (shared/docs/algorithms-more.md §4, §3.1, §3.2, §1.1, §2.5) as plain per-element loops in double.
// It shares no code with src/math: it is written from the torch docs and code, so a kernel and the
// oracle agreeing means something. Hyper-parameters are used exactly as given (no rounding of
// scalars to f32), so the same functions reproduce torch's float64 path.
//
// Each function performs one step of one tensor in place. `step` is that tensor's step counter
// after the increment, as torch's state['step'] (1 on its first update). State spans a rule does
// not use under the given hyper-parameters may be empty.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

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

// Lion as lion-pytorch computes it (lion-pytorch has no step counter). weight_decay is the factor
// of lr (hyper.h: the decoupled_weight_decay division by the constructor's lr is the caller's).
inline void LionStep(const LionHyper& h, std::span<double> p, std::span<const double> g,
                     std::span<double> exp_avg) {
  // sign(c) as torch.sgn: +1, −1, or 0 for ±0 and NaN (neither comparison holds).
  const auto sign = [](double c) { return c > 0.0 ? 1.0 : (c < 0.0 ? -1.0 : 0.0); };
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    double& m = exp_avg[i];
    p[i] *= 1.0 - h.lr * h.weight_decay;                  // θ = θ (1 − γλ) (also when λ = 0)
    const double c = h.beta1 * m + (1.0 - h.beta1) * gi;  // c = β1 m + (1 − β1) g
    p[i] -= h.lr * sign(c);                               // θ = θ − γ sign(c)
    m = h.beta2 * m + (1.0 - h.beta2) * gi;               // m = β2 m + (1 − β2) g
  }
}

// LAMB as apex FusedLAMB computes it, per tensor; `g` is the gradient already clipped (apex's
// global max_grad_norm clipping is the caller's). Two passes: the Adam update u of every element,
// then p −= ratio·u with the trust ratio of the whole tensor.
inline void LambStep(const LambHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> exp_avg,
                     std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 =
      h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;  // bc1 = 1 − β1^t (or 1)
  const double bias_correction2 =
      h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;     // bc2 = 1 − β2^t (or 1)
  const double beta3 = h.grad_averaging ? 1.0 - h.beta1 : 1.0;  // β3 = 1 − β1 (or 1)
  const bool decay = h.weight_decay != 0.0;
  std::vector<double> u(p.size());
  double param_sq = 0.0;
  double update_sq = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = g[i];
    if (!h.adam_w_mode && decay) gi += h.weight_decay * p[i];  // L2 mode: g = g + λθ
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m = h.beta1 * m + beta3 * gi;                 // m = β1 m + β3 g
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;  // v = β2 v + (1 − β2) g²
    u[i] = (m / bias_correction1) /
           (std::sqrt(v / bias_correction2) + h.eps);  // u = (m / bc1) / (√(v / bc2) + ε)
    if (h.adam_w_mode && decay) u[i] += h.weight_decay * p[i];  // AdamW mode: u = u + λθ
    param_sq += p[i] * p[i];                                    // ‖θ‖² (θ before the update)
    update_sq += u[i] * u[i];                                   // ‖u‖²
  }
  const double param_norm = std::sqrt(param_sq);
  const double update_norm = std::sqrt(update_sq);
  // ratio = γ ‖θ‖ / ‖u‖ where (nvlamb or λ ≠ 0) and both norms are non-zero, else γ
  const double ratio = (h.use_nvlamb || decay) && param_norm != 0.0 && update_norm != 0.0
                           ? h.lr * (param_norm / update_norm)
                           : h.lr;
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= ratio * u[i];  // θ = θ − ratio u
}

// torch.optim.RAdam; with decoupled_weight_decay the decay is AdamW's. Steps whose SMA length rho_t
// is at most 5 take p −= lr·m̂ (v is still updated); later ones the rectified adaptive step.
inline void RadamStep(const RadamHyper& h, std::int64_t step, std::span<double> p,
                      std::span<const double> g, std::span<double> exp_avg,
                      std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);  // bc1 = 1 − β1^t
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);  // bc2 = 1 − β2^t
  const double rho_inf = 2.0 / (1.0 - h.beta2) - 1.0;          // ρ∞ = 2 / (1 − β2) − 1
  const double rho_t =
      rho_inf - 2.0 * t * std::pow(h.beta2, t) / bias_correction2;  // ρt = ρ∞ − 2t β2^t / bc2
  const bool rectified = rho_t > 5.0;
  const double rect = rectified ? std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf /
                                            ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
                                : 0.0;  // r = √((ρt − 4)(ρt − 2)ρ∞ / ((ρ∞ − 4)(ρ∞ − 2)ρt))
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) {
      if (h.decoupled_weight_decay) {
        p[i] *= 1.0 - h.lr * h.weight_decay;  // θ = θ (1 − γλ)
      } else {
        gi += h.weight_decay * p[i];  // g = g + λθ
      }
    }
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m += (1.0 - h.beta1) * (gi - m);              // m = lerp(m, g, 1 − β1)
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;  // v = β2 v + (1 − β2) g²
    const double m_hat = m / bias_correction1;    // m̂ = m / bc1
    if (rectified) {
      p[i] -= h.lr * m_hat * rect * std::sqrt(bias_correction2) /
              (std::sqrt(v) + h.eps);  // θ = θ − γ m̂ r √bc2 / (√v + ε)
    } else {
      p[i] -= h.lr * m_hat;  // θ = θ − γ m̂
    }
  }
}

// torch.optim.NAdam; with decoupled_weight_decay the decay is AdamW's. μ_t = β1(1 − ½·0.96^(tψ)),
// and the product Π_{i≤t} μ_i (torch's state['mu_product']) rebuilt from the step, in double.
inline double NadamMu(const NadamHyper& h, double t) {
  return h.beta1 * (1.0 - 0.5 * std::pow(0.96, t * h.momentum_decay));  // μ_t
}
inline void NadamStep(const NadamHyper& h, std::int64_t step, std::span<double> p,
                      std::span<const double> g, std::span<double> exp_avg,
                      std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  double mu_product = 1.0;  // Π_{i≤t} μ_i
  for (std::int64_t i = 1; i <= step; ++i) mu_product *= NadamMu(h, static_cast<double>(i));
  const double mu = NadamMu(h, t);
  const double mu_next = NadamMu(h, t + 1.0);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);  // bc2 = 1 − β2^t
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) {
      if (h.decoupled_weight_decay) {
        p[i] *= 1.0 - h.lr * h.weight_decay;  // θ = θ (1 − γλ)
      } else {
        gi += h.weight_decay * p[i];  // g = g + λθ
      }
    }
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m += (1.0 - h.beta1) * (gi - m);                               // m = lerp(m, g, 1 − β1)
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;                   // v = β2 v + (1 − β2) g²
    const double denom = std::sqrt(v / bias_correction2) + h.eps;  // √(v / bc2) + ε
    // θ = θ − γ(1 − μ_t) g / ((1 − Π_t) d) − γ μ_{t+1} m / ((1 − Π_t μ_{t+1}) d)
    p[i] -= h.lr * (1.0 - mu) / (1.0 - mu_product) * gi / denom;
    p[i] -= h.lr * mu_next / (1.0 - mu_product * mu_next) * m / denom;
  }
}

// torch.optim.Adadelta: running means of g² (square_avg) and of the squared steps (acc_delta); the
// step is √(acc_delta + ε) / √(square_avg + ε) · g.
inline void AdadeltaStep(const AdadeltaHyper& h, std::span<double> p, std::span<const double> g,
                         std::span<double> square_avg, std::span<double> acc_delta) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λθ
    double& v = square_avg[i];
    double& u = acc_delta[i];
    v = h.rho * v + (1.0 - h.rho) * gi * gi;  // v = ρ v + (1 − ρ) g²
    const double delta =
        std::sqrt(u + h.eps) / std::sqrt(v + h.eps) * gi;  // Δ = √(u + ε) / √(v + ε) g
    u = h.rho * u + (1.0 - h.rho) * delta * delta;         // u = ρ u + (1 − ρ) Δ²
    p[i] -= h.lr * delta;                                  // θ = θ − γ Δ
  }
}

// torch.optim.Adamax: the first moment and the exponentially weighted infinity norm u (eps inside
// the max, no bias correction of u).
inline void AdamaxStep(const AdamaxHyper& h, std::int64_t step, std::span<double> p,
                       std::span<const double> g, std::span<double> exp_avg,
                       std::span<double> exp_inf) {
  const double clr = h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(step)));  // γ / (1 − β1^t)
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λθ
    double& m = exp_avg[i];
    double& u = exp_inf[i];
    m += (1.0 - h.beta1) * (gi - m);  // m = lerp(m, g, 1 − β1) (Inf − Inf: NaN, as torch)
    u = MaximumPropagatingNaN(h.beta2 * u, std::abs(gi) + h.eps);  // u = max(β2 u, |g| + ε)
    p[i] -= clr * m / u;                                           // θ = θ − γ̃ m / u
  }
}

// RMSpropTF (torch_npu's NpuFusedRMSpropTF, shared/docs/algorithms-more.md §1.4): eps inside the
// sqrt; square_avg must hold 1 before the first step. `momentum_buffer` is used when momentum > 0,
// `grad_avg` when centered.
inline void RmsproptfStep(const RmsproptfHyper& h, std::span<double> p, std::span<const double> g,
                          std::span<double> square_avg, std::span<double> momentum_buffer,
                          std::span<double> grad_avg) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = g[i];
    if (h.weight_decay != 0.0) {
      if (h.decoupled_decay) {
        p[i] *= 1.0 - h.weight_decay;  // θ = θ (1 − λ), not scaled by γ
      } else {
        gi += h.weight_decay * p[i];  // g = g + λθ
      }
    }
    double& v = square_avg[i];
    v += (1.0 - h.alpha) * (gi * gi - v);  // v = v + (1 − α)(g² − v)
    double avg;
    if (h.centered) {
      double& ga = grad_avg[i];
      ga += (1.0 - h.alpha) * (gi - ga);     // ḡ = ḡ + (1 − α)(g − ḡ)
      avg = std::sqrt(v - ga * ga + h.eps);  // √(v − ḡ² + ε)
    } else {
      avg = std::sqrt(v + h.eps);  // √(v + ε)
    }
    if (h.momentum > 0.0) {
      double& b = momentum_buffer[i];
      if (h.lr_in_momentum) {
        b = h.momentum * b + h.lr * gi / avg;  // b = μ b + γ g / avg
        p[i] -= b;                             // θ = θ − b
      } else {
        b = h.momentum * b + gi / avg;  // b = μ b + g / avg
        p[i] -= h.lr * b;               // θ = θ − γ b
      }
    } else {
      p[i] -= h.lr * gi / avg;  // θ = θ − γ g / avg
    }
  }
}

// torch.optim.ASGD: θ = θ(1 − λη) − ηg, then the average ax: a copy of θ until averaging starts
// (μ = 1), ax = ax + μ(θ − ax) after. A step uses the η and μ of the step before: η_0 = γ, μ_0 = 1,
// and after step t η_t = γ / (1 + λγt)^α, μ_t = 1 / max(1, t − t0), rebuilt from the step in
// double.
inline void AsgdStep(const AsgdHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> ax) {
  const auto before = static_cast<double>(step - 1);
  const double eta = h.lr / std::pow(1.0 + h.lambd * h.lr * before, h.alpha);  // η_{t−1}
  const double mu = 1.0 / std::max(1.0, before - h.t0);                        // μ_{t−1}
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λ_wd θ
    p[i] = p[i] * (1.0 - h.lambd * eta) - eta * gi;          // θ = θ(1 − λη) − ηg
    ax[i] = mu == 1.0 ? p[i] : ax[i] + mu * (p[i] - ax[i]);  // ax = θ | ax + μ(θ − ax)
  }
}

// LARS as apex LARC computes it around torch.optim.SGD (weight decay 0 inside): per tensor the
// local rate tc·‖θ‖ / (‖g‖ + λ‖θ‖ + ε), in clip mode min(rate / γ, 1); where both norms are
// non-zero d = (g + λθ)·rate, else d = g (no decay). Then SGD's momentum step on d.
// `momentum_buffer` is used when momentum != 0; at step 1 it is (re)started.
inline void LarsStep(const LarsHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> momentum_buffer) {
  double param_sq = 0.0;
  double grad_sq = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    param_sq += p[i] * p[i];  // ‖θ‖²
    grad_sq += g[i] * g[i];   // ‖g‖²
  }
  const double param_norm = std::sqrt(param_sq);
  const double grad_norm = std::sqrt(grad_sq);
  const bool trust = param_norm != 0.0 && grad_norm != 0.0;
  // rate = tc‖θ‖ / (‖g‖ + λ‖θ‖ + ε); clip: rate = min(rate / γ, 1), NaN kept (Python's min)
  double rate =
      h.trust_coefficient * param_norm / (grad_norm + param_norm * h.weight_decay + h.eps);
  if (h.clip) rate = 1.0 < rate / h.lr ? 1.0 : rate / h.lr;
  for (std::size_t i = 0; i < p.size(); ++i) {
    double d = g[i];
    if (trust) d = (d + h.weight_decay * p[i]) * rate;  // d = (g + λθ)·rate
    if (h.momentum != 0.0) {
      double& b = momentum_buffer[i];
      if (step == 1) {
        b = d;  // b_1 = d
      } else {
        b = h.momentum * b + (1.0 - h.dampening) * d;  // b_t = μ b_{t-1} + (1 − τ) d
      }
      d = h.nesterov ? d + h.momentum * b : b;  // d = d + μ b_t (nesterov) | d = b_t
    }
    p[i] -= h.lr * d;  // θ = θ − γ d
  }
}

// torch.optim.Rprop: per element, the step size Δ grows by η+ while g keeps the sign of the last
// gradient used, shrinks by η− when it flips (and then the gradient counts as 0: no move, and 0 is
// what the next step compares with), is kept when either is 0, and stays in [Δmin, Δmax];
// θ = θ − sgn(g)·Δ. NaN products and gradients have sign 0, as torch.sign (NaN Δ stays NaN).
inline void RpropStep(const RpropHyper& h, std::span<double> p, std::span<const double> g,
                      std::span<double> prev, std::span<double> step_size) {
  const auto sgn = [](double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0); };
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    const double s = sgn(gi * prev[i]);     // s = sgn(g·prev)
    const double factor = s > 0.0 ? h.etaplus : (s < 0.0 ? h.etaminus : 1.0);
    double& d = step_size[i];
    d *= factor;  // Δ = Δ·η
    if (!std::isnan(d)) d = std::min(std::max(d, h.step_size_min), h.step_size_max);
    if (s < 0.0) gi = 0.0;  // g = 0 where the sign flipped
    p[i] -= sgn(gi) * d;    // θ = θ − sgn(g)Δ
    prev[i] = gi;           // prev = g
  }
}

// AdamP as clovaai's adamp.AdamP computes it (shared/docs/algorithms-more.md §1.1). `rows`: the
// param's size(0) when it has more than one dimension (its channel view is rows × numel / rows),
// 0 for a param with at most one dimension, which is never projected. Two passes, as the
// reference: the moments and the perturbation u of every element, then per view (the channel rows,
// then the whole tensor) the cosine similarity of the raw gradient and the param; the first view
// whose largest |cos| is below delta / √(row length) projects u row by row.
inline void AdampStep(const AdampHyper& h, std::int64_t step, std::size_t rows, std::span<double> p,
                      std::span<const double> g, std::span<double> exp_avg,
                      std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);  // bc1 = 1 − β1^t
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);  // bc2 = 1 − β2^t
  const std::size_t n = p.size();
  std::vector<double> u(n);
  for (std::size_t i = 0; i < n; ++i) {
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m = h.beta1 * m + (1.0 - h.beta1) * g[i];         // m = β1 m + (1 − β1) g
    v = h.beta2 * v + (1.0 - h.beta2) * g[i] * g[i];  // v = β2 v + (1 − β2) g²
    const double denom = std::sqrt(v) / std::sqrt(bias_correction2) + h.eps;  // √v / √bc2 + ε
    u[i] = h.nesterov ? (h.beta1 * m + (1.0 - h.beta1) * g[i]) / denom  // (β1 m + (1 − β1) g) / d
                      : m / denom;                                      // m / d
  }
  double wd_ratio = 1.0;
  if (rows > 0 && n > 0) {
    for (const std::size_t view_rows : {rows, std::size_t{1}}) {
      const std::size_t length = n / view_rows;
      double largest = 0.0;
      bool nan = false;
      for (std::size_t r = 0; r < view_rows; ++r) {
        double gp = 0.0, gg = 0.0, pp = 0.0;
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) {
          gp += g[i] * p[i];
          gg += g[i] * g[i];
          pp += p[i] * p[i];
        }
        // |cos| = |g·p| / (max(‖g‖, ε) max(‖p‖, ε))
        const double c =
            std::abs(gp) / (std::max(std::sqrt(gg), h.eps) * std::max(std::sqrt(pp), h.eps));
        nan = nan || std::isnan(c);
        largest = std::max(largest, c);
      }
      if (nan || !(largest < h.delta / std::sqrt(static_cast<double>(length)))) continue;
      for (std::size_t r = 0; r < view_rows; ++r) {
        double pp = 0.0;
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) pp += p[i] * p[i];
        const double norm = std::sqrt(pp) + h.eps;  // ‖p_r‖ + ε
        double radial = 0.0;                        // Σ p̂ u, p̂ = p / (‖p_r‖ + ε)
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) radial += p[i] / norm * u[i];
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) {
          u[i] -= p[i] / norm * radial;  // u = u − p̂ Σ p̂ u
        }
      }
      wd_ratio = h.wd_ratio;
      break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (h.weight_decay > 0.0) p[i] *= 1.0 - h.lr * h.weight_decay * wd_ratio;  // θ = θ(1 − γλr)
    p[i] -= h.lr / bias_correction1 * u[i];  // θ = θ − γ/bc1 u
  }
}

// BertAdam (torch_npu NpuFusedBertAdam / HF BertAdam, shared/docs/algorithms-more.md §1.2) with
// fusedopt's schedules (warmup −1 as 0, cosine with cos, poly 0 from x = 1). The gradient clipping
// is per (group, dtype) buffer: BertAdamClip gives the factor from the buffer's Σg², and the caller
// passes it to every tensor of the buffer as `clip`.
inline double BertAdamClip(double max_grad_norm, double sum_of_squares) {
  if (!(max_grad_norm > 0.0)) return 1.0;
  const double c = max_grad_norm / (std::sqrt(sum_of_squares) + 1e-6);  // max / (‖g‖ + 1e-6)
  return c < 1.0 ? c : 1.0;  // applied when below 1 (a NaN norm: never)
}

// lr · the schedule at the step before this one (s = step − 1; x = s / t_total), or lr.
inline double BertAdamScheduledLr(const BertAdamHyper& h, std::int64_t step) {
  if (h.t_total == -1.0) return h.lr;
  const double x = static_cast<double>(step - 1) / h.t_total;
  const double w = h.warmup < 0.0 ? 0.0 : h.warmup;
  if (x < w) return h.lr * x / w;  // linear warmup
  switch (h.schedule) {
    case kBertAdamWarmupConstant:
      return h.lr;
    case kBertAdamWarmupCosine:
      return h.lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * x));
    case kBertAdamWarmupPoly:
      return x >= 1.0 ? 0.0 : h.lr * std::sqrt(1.0 - x);
    default:
      return h.lr * std::max((x - 1.0) / (w - 1.0), 0.0);  // from 1 at x = w to 0 at x = 1
  }
}

inline void BertAdamStep(const BertAdamHyper& h, std::int64_t step, double clip,
                         std::span<double> p, std::span<const double> g, std::span<double> exp_avg,
                         std::span<double> exp_avg_sq) {
  const double lr = BertAdamScheduledLr(h, step);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * clip;
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m = h.b1 * m + (1.0 - h.b1) * gi;                      // m = β1 m + (1 − β1) g
    v = h.b2 * v + (1.0 - h.b2) * gi * gi;                 // v = β2 v + (1 − β2) g²
    double u = m / (std::sqrt(v) + h.e);                   // u = m / (√v + e)
    if (h.weight_decay > 0.0) u += h.weight_decay * p[i];  // u = u + λθ
    p[i] -= lr * u;                                        // θ = θ − lr_s u
  }
}

// torch.optim.Adafactor (torch 2.13, shared/docs/algorithms-more.md §2.5). `rows`, `cols`: the
// param's last two dimensions when it has more than one (a batch of p.size() / (rows·cols)
// row-major matrices; row_var holds batch·rows values, col_var batch·cols), both 0 for a vector
// (variance holds p.size() values). eps1 is used as given (the caller resolves torch's None).
inline void AdafactorStep(const AdafactorHyper& h, std::int64_t step, std::size_t rows,
                          std::size_t cols, std::span<double> p, std::span<const double> grad,
                          std::span<double> row_var, std::span<double> col_var,
                          std::span<double> variance) {
  const auto t = static_cast<double>(step);
  const std::size_t n = p.size();
  const double w = std::pow(t, h.beta2_decay);            // 1 − β2_t = t^beta2_decay
  const double rho = std::min(h.lr, 1.0 / std::sqrt(t));  // ρ = min(lr, 1/√t)
  double param_sq = 0.0;
  for (const double x : p) param_sq += x * x;
  const double rms = std::sqrt(param_sq) / std::sqrt(static_cast<double>(n));  // RMS(p)
  const double alpha = std::max(h.eps2, rms) * rho;  // α = max(ε2, RMS(p))·ρ
  std::vector<double> g(n), u(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = h.maximize ? -grad[i] : grad[i];
  if (rows > 0) {
    const std::size_t batch = n / (rows * cols);
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t base = b * rows * cols;
      for (std::size_t r = 0; r < rows; ++r) {  // R = lerp(R, mean_c g², w)
        double sum = 0.0;
        for (std::size_t c = 0; c < cols; ++c)
          sum += g[base + r * cols + c] * g[base + r * cols + c];
        double& x = row_var[b * rows + r];
        x += w * (sum / static_cast<double>(cols) - x);
      }
      for (std::size_t c = 0; c < cols; ++c) {  // C = lerp(C, mean_r g², w)
        double sum = 0.0;
        for (std::size_t r = 0; r < rows; ++r)
          sum += g[base + r * cols + c] * g[base + r * cols + c];
        double& x = col_var[b * cols + c];
        x += w * (sum / static_cast<double>(rows) - x);
      }
      double mean = 0.0;  // max(mean_r R, ε1)
      for (std::size_t r = 0; r < rows; ++r) mean += row_var[b * rows + r];
      mean = std::max(mean / static_cast<double>(rows), h.eps1);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t c = 0; c < cols; ++c) {
          const std::size_t i = base + r * cols + c;
          const double v = row_var[b * rows + r] * col_var[b * cols + c] / mean;  // V = R C / mean
          u[i] = g[i] / std::sqrt(std::max(v, h.eps1 * h.eps1));  // U = g / √max(V, ε1²)
        }
      }
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      variance[i] += w * (g[i] * g[i] - variance[i]);  // V = lerp(V, g², w)
      u[i] = g[i] / std::sqrt(std::max(variance[i], h.eps1 * h.eps1));
    }
  }
  double update_sq = 0.0;
  for (const double x : u) update_sq += x * x;
  // den = max(1, RMS(U) / d)
  const double denom =
      std::max(1.0, std::sqrt(update_sq) / (std::sqrt(static_cast<double>(n)) * h.d));
  for (std::size_t i = 0; i < n; ++i) {
    if (h.weight_decay != 0.0) p[i] *= 1.0 - h.lr * h.weight_decay;  // θ = θ(1 − γλ)
    p[i] -= alpha / denom * u[i];                                    // θ = θ − α/den·U
  }
}

}  // namespace fusedopt::ref
