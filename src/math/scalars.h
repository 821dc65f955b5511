// Per-tensor f32 coefficients of each update rule, computed on the host in double and rounded once
// (src/core/coefficients.cc), exactly where torch.optim rounds its Python-float scalars. The math
// bodies in <algo>_math.h read only these.
#pragma once

#include <cstddef>

// Marks the math bodies (<algo>_math.h) for a device compiler: empty for the CPU, where Highway's
// per-target code and plain scalar Ops (tests/math_scalar_test.cc) instantiate them; a CUDA
// backend defines it as __host__ __device__ before including them.
#ifndef FOPT_HOST_DEVICE
#  define FOPT_HOST_DEVICE
#endif

namespace fusedopt {

// lerp_(end, w) as ATen evaluates it: for w < 0.5 `self + w·(end − self)`,
// else `end − (1 − w)·(end − self)`, both as one fma. `weight_minus_one` is the f32 `w − 1` ATen
// computes.
struct LerpCoef {
  float weight = 0.0f;
  float weight_minus_one = -1.0f;
  bool from_end = false;
};

struct SgdScalars {
  float grad_mul;  // -1 with maximize, else 1 (exact either way)
  float weight_decay;
  float momentum;
  float one_minus_dampening;
  float neg_lr;
  bool has_weight_decay;
  bool has_momentum;
  bool nesterov;
  bool first_step;  // momentum buffer starts as a copy of the gradient (no dampening), as torch
};

struct AdamScalars {
  float grad_mul;
  float weight_decay;   // coupled (Adam) L2 term, used when coupled_weight_decay
  float decay_mul;      // decoupled (AdamW) factor f32(1 − lr·wd); exactly 1 when off
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;
  float eps;
  float neg_step_size;  // −lr / (1 − beta1^step)
  bool coupled_weight_decay;
  bool amsgrad;
};

struct RmspropScalars {
  float grad_mul;
  float weight_decay;
  float alpha;
  float one_minus_alpha;
  LerpCoef grad_avg_lerp;  // grad_avg.lerp_(grad, 1 − alpha)
  float eps;
  float momentum;
  float neg_lr;
  bool has_weight_decay;
  bool centered;
  bool has_momentum;
};

struct AdagradScalars {
  float grad_mul;
  float weight_decay;
  float eps;
  float neg_clr;  // −lr / (1 + (step − 1)·lr_decay)
  bool has_weight_decay;
};

struct LionScalars {
  float grad_mul;
  float decay_mul;  // f32(1 − lr·wd): lion-pytorch multiplies even when wd = 0 (exactly 1 then)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float neg_lr;
};

struct AdamaxScalars {
  float grad_mul;
  float weight_decay;
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float eps;
  float neg_clr;  // −lr / (1 − beta1^step)
  bool has_weight_decay;
};

struct AdadeltaScalars {
  float grad_mul;
  float weight_decay;
  float rho;
  float one_minus_rho;
  float eps;
  float neg_lr;
  bool has_weight_decay;
};

struct RadamScalars {
  float grad_mul;
  float weight_decay;   // coupled (L2) term, used when coupled_weight_decay
  float decay_mul;      // decoupled factor f32(1 − lr·wd); exactly 1 when off
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float one_minus_beta2;
  float bias_correction1;  // 1 − beta1^step
  float lr;
  float bias_correction2_sqrt;  // (1 − beta2^step)**0.5
  float eps;
  float rect;  // the rectification term (rectified steps only)
  bool coupled_weight_decay;
  bool rectified;  // rho_t > 5: the adaptive, rectified step; else p −= lr·m̂
};

struct NadamScalars {
  float grad_mul;
  float weight_decay;   // coupled (L2) term, used when coupled_weight_decay
  float decay_mul;      // decoupled factor f32(1 − lr·wd); exactly 1 when off
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float one_minus_beta2;
  float bias_correction2;  // 1 − beta2^step
  float eps;
  float grad_coef;     // c1 = −lr·(1 − mu) / (1 − mu_product)
  float exp_avg_coef;  // c2 = −lr·mu_next / (1 − mu_product·mu_next)
  bool coupled_weight_decay;
};

// Weight decay of RMSpropTF: none, added to the gradient, or multiplying the param.
enum class RmsproptfDecay : unsigned char { kNone, kCoupled, kDecoupled };

struct RmsproptfScalars {
  float grad_mul;      // grad_scale (no maximize in the reference)
  float weight_decay;  // coupled: g = g + wd·p
  float neg_decay;     // decoupled: p = p + (−wd)·p, f32(−wd)
  float one_minus_alpha;
  float eps;
  float momentum;
  // Momentum: buf = μ·buf + (grad_coef·g)/avg, p = p + neg_buf_coef·buf, with (lr, −1) under
  // lr_in_momentum and (1, −lr) without: the products by 1 and −1 are exact, so one body rounds as
  // either reference line.
  float grad_coef;
  float neg_buf_coef;
  float neg_lr;  // no momentum: p = p + (−lr·g)/avg
  RmsproptfDecay decay;
  bool centered;
  bool has_momentum;
};

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

// Rprop's factors and bounds, each a Python float rounded to f32 as torch's masked fills and clamp_
// round it.
struct RpropScalars {
  float grad_mul;
  float etaminus;
  float etaplus;
  float step_size_min;
  float step_size_max;
};

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

// The first pass of LARS reduces ‖p‖² and ‖g‖² per tensor (g unscaled); Lars::Finish sets the
// trust ratio and whether it applies, then the second pass runs SGD on (g + λθ)·ratio or on g.
struct LarsScalars {
  float grad_mul;  // grad_scale: the loss-scale and clip factors, applied as the gradient is read
  float weight_decay;
  float ratio;  // LARC's adaptive_lr (clipped to ≤ 1 in clip mode), set after the reduction pass
  float momentum;
  float one_minus_dampening;
  float neg_lr;
  bool trust;  // both norms non-zero: g = (g + λθ)·ratio; else g as it is (and no weight decay)
  bool has_momentum;
  bool nesterov;
  bool first_step;  // momentum buffer starts as a copy of the gradient (no dampening), as torch
};

// AdamP's first pass reduces, per channel row of a param with more than one dimension, Σg·p, Σg²,
// Σp² and Σp·u (g the raw gradient, u the perturbation before the projection); Adamp::Finish picks
// the projection and fills its per-row values and the decay in between.
struct AdampScalars {
  float grad_mul;  // grad_scale: the loss-scale and clip factors, applied as the gradient is read
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // math.sqrt(1 − β2^t)
  float eps;
  float neg_step_size;  // −lr / (1 − β1^t)
  float decay_mul;  // 1 − lr·wd·wd_ratio (wd_ratio 1 unprojected), set after the reduction pass
  std::size_t reduce_row_length;   // numel / Segment::rows; 0: at most one dimension (no sums)
  std::size_t project_row_length;  // set by Finish: the channel row length, numel (the layer), 0
  const float* row_values;         // set by Finish: per projected row ‖p_r‖ + eps and Σ p̂·u
  bool nesterov;
  bool decay;  // weight_decay > 0
};

// Adafactor's coefficients of one tensor. The factors and neg_alpha are set between the passes (by
// Adafactor::FinishStats and FinishNorm), from the sums of the passes before.
struct AdafactorScalars {
  float grad_mul;          // −grad_scale with maximize, else grad_scale
  LerpCoef variance_lerp;  // variance.lerp_(grad * grad, t^beta2_decay) (vectors)
  float eps1_sq;           // clamp_(min=eps1 * eps1): the double product, rounded once
  float decay_mul;         // param.mul_(1 − lr·wd): rounded once; 1 when wd = 0
  float neg_alpha;         // −alpha / denom, set after the ‖U‖ pass
  std::size_t rows;        // Segment::rows (size(-2)); 0: a vector (variance)
  std::size_t cols;        // Segment::cols (size(-1))
  const float* row_var;    // batch·rows: the row factors after this step's lerp
  const float* col_var;    // batch·cols: the column factors after this step's lerp
  const float* row_mean;   // batch: row_var.mean(dim=-2).clamp_(min=eps1)
  bool decay;              // weight_decay != 0
};

}  // namespace fusedopt
