// Hyper-parameters of each optimizer, one struct per parameter group, with torch.optim's names and
// defaults (shared/docs/torch-semantics.md §2). The index of each algorithm's state buffers in
// Segment::state is given next to its struct, named after torch's state_dict keys.
#pragma once

// Every algorithm, once: X(Stem, Alias) for the hyper-parameters Stem##Hyper, the step function
// Stem##Step (step.h), the stateful class fusedopt::Alias = Optimizer<Stem##Hyper> (optimizer.h)
// and the descriptor algos::Stem (src/algos/registry.h, whose list of descriptors is this one).
// The declarations, aliases and explicit instantiations expand it, so adding an algorithm adds one
// line here.
#define FUSEDOPT_FOR_EACH_ALGORITHM(X) FUSEDOPT_ALGORITHM_LIST_(FUSEDOPT_APPLY_ENTRY_, X)
// The list itself, with the callback passed on (Apply(X, Stem, Alias)), so that other lists can be
// derived from it (the registry's X(Stem)).
// clang-format off
#define FUSEDOPT_ALGORITHM_LIST_(Apply, X) \
  Apply(X, Sgd, SGD)                       \
  Apply(X, Adam, Adam)                     \
  Apply(X, AdamW, AdamW)                   \
  Apply(X, Rmsprop, RMSprop)               \
  Apply(X, Adagrad, Adagrad)               \
  Apply(X, Lion, Lion)                     \
  Apply(X, Lamb, LAMB)                     \
  Apply(X, Adamax, Adamax)                 \
  Apply(X, Adadelta, Adadelta)             \
  Apply(X, Radam, RAdam)                   \
  Apply(X, Nadam, NAdam)                   \
  Apply(X, Asgd, ASGD)                     \
  Apply(X, Lars, LARS)                     \
  Apply(X, Rprop, Rprop)                   \
  Apply(X, Rmsproptf, RMSpropTF)           \
  Apply(X, Adamp, AdamP)                   \
  Apply(X, BertAdam, BertAdam)             \
  Apply(X, Adafactor, Adafactor)
// clang-format on
#define FUSEDOPT_APPLY_ENTRY_(X, Stem, Alias) X(Stem, Alias)

namespace fusedopt {

// torch.optim.SGD. State: momentum_buffer (only when momentum != 0).
struct SgdHyper {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};
enum SgdState : int { kMomentumBuffer = 0 };

// torch.optim.Adam; with decoupled_weight_decay it is torch.optim.AdamW.
// State: exp_avg, exp_avg_sq, max_exp_avg_sq (only with amsgrad).
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled_weight_decay = false;
};
enum AdamState : int { kExpAvg = 0, kExpAvgSq = 1, kMaxExpAvgSq = 2 };

// torch.optim.AdamW: Adam with decoupled weight decay, whose default is 1e-2.
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  AdamHyper ToAdam() const {
    return {lr,           beta1,   beta2,    eps,
            weight_decay, amsgrad, maximize, /*decoupled_weight_decay=*/true};
  }
};

// torch.optim.RMSprop (eps outside the sqrt, as torch; not the TF variant).
// State: square_avg, momentum_buffer (momentum > 0), grad_avg (centered).
struct RmspropHyper {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;
};
enum RmspropState : int { kSquareAvg = 0, kRmspropMomentumBuffer = 1, kGradAvg = 2 };

// torch.optim.Adagrad. State: sum, which the caller fills with initial_accumulator_value before the
// first step (torch does so eagerly in the constructor; the Optimizer layer does it for you).
struct AdagradHyper {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  bool maximize = false;
};
enum AdagradState : int { kSum = 0 };

// Lion (Chen et al. 2023) as lucidrains' lion-pytorch computes it: the update is the sign of an
// interpolation of momentum and gradient, with weight decay decoupled and scaled by lr.
// lion-pytorch's decoupled_weight_decay=True divides weight_decay by the constructor's lr; the
// Python class does that division, so weight_decay here is the factor that multiplies lr. State:
// exp_avg.
struct LionHyper {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
  bool maximize = false;
};
enum LionState : int { kLionExpAvg = 0 };

// torch.optim.Adamax: Adam with the infinity norm, u = max(β2·u, |g| + eps), in place of the
// second moment (no sqrt, no bias correction of u). State: exp_avg, exp_inf.
struct AdamaxHyper {
  double lr = 2e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool maximize = false;
};
enum AdamaxState : int { kAdamaxExpAvg = 0, kExpInf = 1 };

// torch.optim.Adadelta: the step is √(acc_delta + ε) / √(square_avg + ε) · g, scaled by lr (default
// 1). State: square_avg, acc_delta.
struct AdadeltaHyper {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0.0;
  bool maximize = false;
};
enum AdadeltaState : int { kAdadeltaSquareAvg = 0, kAccDelta = 1 };

// torch.optim.RAdam: Adam whose adaptive step is rectified (and used at all) only once the length
// of the approximated simple moving average, rho_t, exceeds 5; before that the step is lr·m̂. With
// decoupled_weight_decay the decay is AdamW's. State: exp_avg, exp_avg_sq.
struct RadamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;
  bool maximize = false;
};
enum RadamState : int { kRadamExpAvg = 0, kRadamExpAvgSq = 1 };

// torch.optim.NAdam: Adam with Nesterov momentum whose momentum coefficient mu_t = beta1·(1 −
// 0.5·0.96^(t·momentum_decay)) warms up over the steps; the product of the mu_t so far is a
// per-tensor scalar state (Segment::scalars[kNadamMuProduct], torch's f32 state['mu_product']).
// With decoupled_weight_decay the decay is AdamW's (NAdamW). State: exp_avg, exp_avg_sq.
// NadamStep reads and advances each segment's scalars[kNadamMuProduct] (start it at 1).
struct NadamHyper {
  double lr = 2e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum_decay = 4e-3;
  bool decoupled_weight_decay = false;
  bool maximize = false;
};
enum NadamState : int { kNadamExpAvg = 0, kNadamExpAvgSq = 1 };
enum NadamScalar : int { kNadamMuProduct = 0 };

// RMSpropTF: TensorFlow's RMSprop as torch_npu's NpuFusedRMSpropTF (and the old timm RMSpropTF)
// computes it: eps inside the sqrt, square_avg starting at one, the squared-gradient average
// updated as sq += (1 − alpha)(g² − sq). Weight decay is added to the gradient (L2), or with
// decoupled_decay multiplies the param by (1 − weight_decay), not scaled by lr (the NPU / old timm
// rule; current timm decays by 1 − lr·weight_decay). With lr_in_momentum (the default) lr is folded
// into the momentum buffer (buf = μ·buf + lr·g/avg, p −= buf), else it scales the step (buf = μ·buf
// + g/avg, p −= lr·buf). State: square_avg (initialized to 1), momentum_buffer (momentum > 0),
// grad_avg (centered).
struct RmsproptfHyper {
  double lr = 1e-2;
  double alpha = 0.9;
  double eps = 1e-10;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool decoupled_decay = false;
  bool lr_in_momentum = true;
};
enum RmsproptfState : int {
  kRmsproptfSquareAvg = 0,
  kRmsproptfMomentumBuffer = 1,
  kRmsproptfGradAvg = 2
};

// torch.optim.ASGD (averaged SGD, Polyak & Juditsky): p = p·(1 − lambd·eta) − eta·g, then the
// running average ax of the params once averaging starts (after step t0). Two per-tensor scalar
// states, torch's f32 0-d tensors: eta, the step size, starts at lr and becomes lr / (1 +
// lambd·lr·t)^alpha after step t; mu, the averaging weight, starts at 1 and becomes 1 / max(1, t −
// t0). A step reads the values the previous one left (Segment::scalars[kAsgdEta], [kAsgdMu]).
// State: ax.
// AsgdStep reads and advances each segment's scalars[kAsgdEta] (start it at lr) and
// scalars[kAsgdMu] (start it at 1).
struct AsgdHyper {
  double lr = 1e-2;
  double lambd = 1e-4;
  double alpha = 0.75;
  double t0 = 1e6;
  double weight_decay = 0.0;
  bool maximize = false;
};
enum AsgdState : int { kAsgdAx = 0 };
enum AsgdScalar : int { kAsgdEta = 0, kAsgdMu = 1 };

// torch.optim.Rprop (resilient backpropagation): per element, the step size grows by etaplus
// while the gradient keeps the sign of the last one used, shrinks by etaminus when it flips (that
// gradient then counts as 0: no move, and 0 is what the next step compares with), and stays within
// [step_size_min, step_size_max]; p −= sign(g)·step_size. State: prev (the last gradient used),
// step_size (starts at lr).
struct RpropHyper {
  double lr = 1e-2;
  double etaminus = 0.5;
  double etaplus = 1.2;
  double step_size_min = 1e-6;
  double step_size_max = 50.0;
  bool maximize = false;
};
enum RpropState : int { kRpropPrev = 0, kRpropStepSize = 1 };

// LAMB as apex's FusedLAMB defines it: Adam's moments, then a per-tensor trust ratio ‖p‖ / ‖u‖ of
// the param and its Adam update u (only where weight_decay != 0 or use_nvlamb, and both norms are
// non-zero). The global gradient-norm clipping of FusedLAMB (max_grad_norm) is the step's pre-pass
// (PrePassOptions::clip_rule = ClipRule::kLamb), not part of this struct. State: exp_avg,
// exp_avg_sq.
// LambStep runs two passes: per-tensor norms of the param and of its Adam update, then the update
// scaled by the trust ratio. Both norms are deterministic like the global gradient norm (grad.h).
struct LambHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool bias_correction = true;
  bool adam_w_mode = true;     // weight decay added to the update (true) or to the gradient (L2)
  bool grad_averaging = true;  // exp_avg takes (1 − beta1)·g (true) or g
  bool use_nvlamb = false;     // trust ratio also where weight_decay == 0
};
enum LambState : int { kLambExpAvg = 0, kLambExpAvgSq = 1 };

// LARS (You et al. 2017) with NVIDIA apex's LARC semantics around torch.optim.SGD: per tensor, the
// local rate ratio = trust_coefficient·‖p‖ / (‖g‖ + ‖p‖·weight_decay + eps), in clip mode
// min(ratio / lr, 1) (an effective lr of min(local rate, lr)); where both norms are non-zero the
// gradient becomes (g + weight_decay·p)·ratio, otherwise it stays g and the step drops the weight
// decay. Then SGD's momentum, dampening and Nesterov step without weight decay (torch.optim.SGD
// with weight_decay=0, as LARC runs it). State: momentum_buffer (only when momentum != 0).
// LarsStep runs two passes: per-tensor norms of the param and of the gradient, then the SGD step
// on the gradient scaled by the trust ratio; the norms are deterministic as LAMB's.
struct LarsHyper {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  double trust_coefficient = 0.02;
  double eps = 1e-8;
  bool nesterov = false;
  bool clip = true;  // LARC's clip mode (min(ratio / lr, 1)); false: scale mode (lr·ratio)
};
enum LarsState : int { kLarsMomentumBuffer = 0 };

// AdamP (Heo et al. 2021) as clovaai's adamp.AdamP computes it (torch_npu's NpuFusedAdamP ports
// it): Adam's moments, u = m / (√v / √(1 − β2^t) + eps) (Nesterov: β1·m + (1 − β1)·g over it);
// for a param with more than one dimension (Segment::rows), where the raw gradient is nearly
// orthogonal to the param (max over the channel rows of |cos(g_r, p_r)| < delta / √(row length),
// or else the same over the whole tensor), u loses its component along each row's p
// (u −= p̂·Σp̂u, p̂ = p / (‖p_r‖ + eps)) and the decoupled decay p *= 1 − lr·wd is scaled by
// wd_ratio; then p −= lr / (1 − β1^t)·u. State: exp_avg, exp_avg_sq.
// AdampStep runs two passes: per channel row (Segment::rows) the sums of the raw gradient and the
// param that decide and make the projection, then the projected update; the sums are deterministic
// as LAMB's norms.
struct AdampHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double delta = 0.1;
  double wd_ratio = 0.1;
  bool nesterov = false;
};
enum AdampState : int { kAdampExpAvg = 0, kAdampExpAvgSq = 1 };

// The lr schedules of BertAdam, factors of lr at progress x = s / t_total (s: the steps taken
// before this one) with warmup w: all x / w while x < w; then warmup_linear max((x − 1) / (w − 1),
// 0), warmup_constant 1, warmup_cosine 0.5·(1 + cos(πx)), warmup_poly (1 − x)^0.5 (0 from x = 1).
enum BertAdamSchedule : int {
  kBertAdamWarmupLinear = 0,
  kBertAdamWarmupConstant = 1,
  kBertAdamWarmupCosine = 2,
  kBertAdamWarmupPoly = 3
};

// BertAdam (HF pytorch-pretrained-bert's BertAdam, as torch_npu's NpuFusedBertAdam runs it): Adam
// without bias correction, u = m / (√v + e) (+ weight_decay·p when weight_decay > 0), p −= lr_s·u,
// lr_s = lr·schedule(s / t_total, warmup) (lr when t_total is −1). With max_grad_norm > 0 the
// gradients of each (group, param dtype) are first scaled by max_grad_norm / (‖g‖ + 1e-6) of that
// buffer when it is below 1 (NpuFusedBertAdam's per-buffer clipping; the step's reduction pass).
// Names and defaults are the reference's (lr is required there). State: exp_avg, exp_avg_sq.
// BertAdamStep runs two passes when max_grad_norm > 0: Σg² of every tensor, added per (group,
// param dtype) for the clip factor of each such buffer, then the update. The segments' step is the
// one after this update (1 on the first), so the schedule reads step − 1.
struct BertAdamHyper {
  double lr = 1e-3;
  double warmup = -1.0;   // fraction of t_total; −1: none
  double t_total = -1.0;  // steps of the schedule; −1: constant lr
  int schedule = kBertAdamWarmupLinear;
  double b1 = 0.9;
  double b2 = 0.999;
  double e = 1e-6;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;  // <= 0: no clipping
};
enum BertAdamState : int { kBertAdamExpAvg = 0, kBertAdamExpAvgSq = 1 };
// torch.optim.Adafactor (torch 2.13's _single_tensor_adafactor): factored second moments. For a
// param of more than one dimension (Segment::rows = size(-2), Segment::cols = size(-1); leading
// dimensions are a batch) the state is row_var [..., rows, 1] and col_var [..., 1, cols], lerped
// towards the row and column means of g² with weight t^beta2_decay; V = row_var ⊗ col_var /
// max(mean(row_var), eps1). A param of at most one dimension keeps variance (like the param) and
// V = variance. U = g / √max(V, eps1²); p *= 1 − lr·wd; p −= max(eps2, RMS(p))·min(lr, 1/√t) /
// max(1, RMS(U) / d)·U (RMS(p) before the decay). torch's eps = (eps1, eps2); its eps1 None
// (finfo(param dtype).eps of the group's first param with a grad) is resolved by the caller: the
// default here is finfo(float32).eps. State: row_var, col_var (matrices) or variance (vectors).
// AdafactorStep runs three passes over a factored param (Segment::rows, cols): Σp² with the row
// and column sums of g², then ΣU² from the new factors, then the update; two over a vector param
// (Σp² and ΣU², then the update). Every sum is deterministic as LAMB's norms; the states are
// written only by the last pass.
struct AdafactorHyper {
  double lr = 1e-2;
  double beta2_decay = -0.8;
  double eps1 = 1.1920928955078125e-07;
  double eps2 = 1e-3;
  double d = 1.0;
  double weight_decay = 0.0;
  bool maximize = false;
};
enum AdafactorState : int { kAdafactorRowVar = 0, kAdafactorColVar = 1, kAdafactorVariance = 2 };

}  // namespace fusedopt
