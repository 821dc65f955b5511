#include "bench/standard.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "bench/elementwise.h"
#include "fusedopt/grad.h"
#include "src/core/parallel.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/standard.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

// Two ATen-like elementary ops the Lion and LAMB baselines need beyond elementwise.h, built the
// same way (one pass, f32 math, rounded to the dtype on store, ATen's grain split over threads):
// out = sgn(a) (Tensor.sgn_: 0 for ±0 and NaN, as torch on the CPU) and out = a / b (torch.div).
HWY_BEFORE_NAMESPACE();
namespace fusedopt::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using fusedopt::HWY_NAMESPACE::ForEachVector;
using fusedopt::HWY_NAMESPACE::HwyOps;
using fusedopt::HWY_NAMESPACE::Io;
using fusedopt::HWY_NAMESPACE::WithStorageType;

void BaselineOpRange(bool divide, void* out_data, const void* a_data, const void* b_data,
                     DType dtype, std::size_t begin, std::size_t end) {
  WithStorageType(dtype, [&](auto tag) HWY_ATTR {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(out_data);
    const T* a = static_cast<const T*>(a_data);
    const T* b = static_cast<const T*>(b_data);
    if (divide) {
      ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
        Io<T>::Store(d, hn::Div(Io<T>::Load(d, a + i), Io<T>::Load(d, b + i)), out + i);
      });
    } else {
      ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
        Io<T>::Store(d, HwyOps<decltype(d)>{d}.Sign(Io<T>::Load(d, a + i)), out + i);
      });
    }
  });
}

}  // namespace fusedopt::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt::bench {
HWY_EXPORT(BaselineOpRange);

namespace {

// out = sgn(a) (divide false) or out = a / b (divide true): one pass, split like RunOp.
void RunBaselineOp(bool divide, TensorRef out, TensorRef a, TensorRef b, const Runtime& runtime) {
  const std::size_t n = out.numel;
  const std::size_t chunks = (n + kGrainElements - 1) / kGrainElements;
  ParallelForChunks(chunks, runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    HWY_DYNAMIC_DISPATCH(BaselineOpRange)
    (divide, out.data, a.data, b.data, out.dtype, c0 * kGrainElements,
     std::min(c1 * kGrainElements, n));
  });
}

// A temporary tensor, allocated and freed per use as ATen's CPU allocator does (no caching).
class Temp {
 public:
  Temp(DType dtype, std::size_t numel)
      : bytes_(new (std::align_val_t{64}) std::byte[numel * DTypeSize(dtype)]),
        ref_{bytes_.get(), dtype, numel} {}
  const TensorRef& ref() const { return ref_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte[], Free> bytes_;
  TensorRef ref_;
};

// A for-loop optimizer step over one tensor, written with the tensor-op vocabulary of
// torch/optim/*.py.
class Tensors {
 public:
  Tensors(const Segment& s, const Runtime& runtime) : s_(s), runtime_(runtime) {}
  TensorRef param() const { return {s_.param, s_.param_dtype, s_.numel}; }
  TensorRef grad() const { return {const_cast<void*>(s_.grad), s_.grad_dtype, s_.numel}; }
  TensorRef state(int slot) const { return {s_.state[slot], s_.state_dtype, s_.numel}; }
  Temp NewTemp() const { return Temp(s_.param_dtype, s_.numel); }

  // x.op_(...) and out = op(...): one pass each.
  void Run(Op op, TensorRef out, TensorRef a, TensorRef b, TensorRef c, double s) const {
    RunOp(op, out, a, b, c, static_cast<float>(s), runtime_);
  }
  void Run(Op op, TensorRef out, TensorRef a, double s) const { Run(op, out, a, a, a, s); }
  void Run(Op op, TensorRef out, TensorRef a, TensorRef b, double s) const {
    Run(op, out, a, b, b, s);
  }
  void Sign(TensorRef out, TensorRef a) const { RunBaselineOp(false, out, a, a, runtime_); }
  void Div(TensorRef out, TensorRef a, TensorRef b) const {
    RunBaselineOp(true, out, a, b, runtime_);
  }
  float Norm(TensorRef a) const { return RunNorm2(a, runtime_); }

  // grad = -grad if maximize; grad = grad.add(param, alpha=wd) if wd != 0. Returns the tensor to
  // use as g.
  TensorRef PrepareGrad(bool maximize, double weight_decay, Temp* storage) const {
    TensorRef g = grad();
    if (!maximize && weight_decay == 0.0) return g;
    *storage = NewTemp();
    if (maximize) Run(Op::kNeg, storage->ref(), g, 0.0);
    if (weight_decay != 0.0)
      Run(Op::kAddScaled, storage->ref(), maximize ? storage->ref() : g, param(), weight_decay);
    return storage->ref();
  }

 private:
  const Segment& s_;
  const Runtime& runtime_;
};

void StandardSgd(const SgdHyper& h, const Segment& s, const Runtime& rt) {
  const Tensors t(s, rt);
  Temp g_storage(s.param_dtype, 0);
  TensorRef d = t.PrepareGrad(h.maximize, h.weight_decay, &g_storage);
  Temp nesterov(s.param_dtype, 0);
  if (h.momentum != 0.0) {
    const TensorRef buf = t.state(kMomentumBuffer);
    if (s.step == 1) {
      t.Run(Op::kCopy, buf, d, 0.0);  // buf = torch.clone(grad)
    } else {
      t.Run(Op::kMulScalar, buf, buf, h.momentum);            // buf.mul_(momentum)
      t.Run(Op::kAddScaled, buf, buf, d, 1.0 - h.dampening);  // buf.add_(grad, alpha=1-dampening)
    }
    if (h.nesterov) {
      nesterov = t.NewTemp();
      t.Run(Op::kAddScaled, nesterov.ref(), d, buf,
            h.momentum);  // grad = grad.add(buf, alpha=momentum)
      d = nesterov.ref();
    } else {
      d = buf;
    }
  }
  t.Run(Op::kAddScaled, t.param(), t.param(), d, -h.lr);  // param.add_(grad, alpha=-lr)
}

void StandardAdam(const AdamHyper& h, const Segment& s, const Runtime& rt) {
  const Tensors t(s, rt);
  Temp g_storage(s.param_dtype, 0);
  TensorRef g = t.grad();
  if (h.decoupled_weight_decay) {
    g = t.PrepareGrad(h.maximize, 0.0, &g_storage);
    if (h.weight_decay != 0.0)
      t.Run(Op::kMulScalar, t.param(), t.param(), 1.0 - h.lr * h.weight_decay);
  } else {
    g = t.PrepareGrad(h.maximize, h.weight_decay, &g_storage);
  }
  const TensorRef m = t.state(kExpAvg);
  const TensorRef v = t.state(kExpAvgSq);
  t.Run(Op::kLerp, m, m, g, 1.0 - h.beta1);        // exp_avg.lerp_(grad, 1-beta1)
  t.Run(Op::kMulScalar, v, v, h.beta2);            // exp_avg_sq.mul_(beta2)
  t.Run(Op::kAddcmul, v, v, g, g, 1.0 - h.beta2);  //   .addcmul_(grad, grad, value=1-beta2)
  const auto step = static_cast<double>(s.step);
  const double bc1 = 1.0 - std::pow(h.beta1, step);
  const double bc2_sqrt = std::pow(1.0 - std::pow(h.beta2, step), 0.5);
  TensorRef second = v;
  if (h.amsgrad) {
    const TensorRef v_max = t.state(kMaxExpAvgSq);
    t.Run(Op::kMaximum, v_max, v_max, v, 0.0);  // torch.maximum(max_exp_avg_sq, v, out=...)
    second = v_max;
  }
  const Temp root = t.NewTemp();
  t.Run(Op::kSqrt, root.ref(), second, 0.0);  // denom = exp_avg_sq.sqrt()
  const Temp denom = t.NewTemp();
  t.Run(Op::kDivScalar, denom.ref(), root.ref(), bc2_sqrt);  //   / bias_correction2_sqrt
  t.Run(Op::kAddScalar, denom.ref(), denom.ref(), h.eps);    //   .add_(eps)
  t.Run(Op::kAddcdiv, t.param(), t.param(), m, denom.ref(), -(h.lr / bc1));  // param.addcdiv_(...)
}

void StandardRmsprop(const RmspropHyper& h, const Segment& s, const Runtime& rt) {
  const Tensors t(s, rt);
  Temp g_storage(s.param_dtype, 0);
  const TensorRef g = t.PrepareGrad(h.maximize, h.weight_decay, &g_storage);
  const TensorRef sq = t.state(kSquareAvg);
  t.Run(Op::kMulScalar, sq, sq, h.alpha);            // square_avg.mul_(alpha)
  t.Run(Op::kAddcmul, sq, sq, g, g, 1.0 - h.alpha);  //   .addcmul_(grad, grad, value=1-alpha)
  const Temp avg = t.NewTemp();
  if (h.centered) {
    const TensorRef ga = t.state(kGradAvg);
    t.Run(Op::kLerp, ga, ga, g, 1.0 - h.alpha);  // grad_avg.lerp_(grad, 1-alpha)
    t.Run(Op::kAddcmul, avg.ref(), sq, ga, ga,
          -1.0);  // square_avg.addcmul(grad_avg, grad_avg, value=-1)
    t.Run(Op::kSqrt, avg.ref(), avg.ref(), 0.0);  //   .sqrt_()
  } else {
    t.Run(Op::kSqrt, avg.ref(), sq, 0.0);  // square_avg.sqrt()
  }
  t.Run(Op::kAddScalar, avg.ref(), avg.ref(), h.eps);  // avg.add_(eps)
  if (h.momentum > 0.0) {
    const TensorRef buf = t.state(kRmspropMomentumBuffer);
    t.Run(Op::kMulScalar, buf, buf, h.momentum);              // buf.mul_(momentum)
    t.Run(Op::kAddcdiv, buf, buf, g, avg.ref(), 1.0);         //   .addcdiv_(grad, avg)
    t.Run(Op::kAddScaled, t.param(), t.param(), buf, -h.lr);  // param.add_(buf, alpha=-lr)
  } else {
    t.Run(Op::kAddcdiv, t.param(), t.param(), g, avg.ref(),
          -h.lr);  // param.addcdiv_(grad, avg, value=-lr)
  }
}

void StandardAdagrad(const AdagradHyper& h, const Segment& s, const Runtime& rt) {
  const Tensors t(s, rt);
  Temp g_storage(s.param_dtype, 0);
  const TensorRef g = t.PrepareGrad(h.maximize, h.weight_decay, &g_storage);
  const double clr = h.lr / (1.0 + static_cast<double>(s.step - 1) * h.lr_decay);
  const TensorRef sum = t.state(kSum);
  t.Run(Op::kAddcmul, sum, sum, g, g, 1.0);  // state_sum.addcmul_(grad, grad, value=1)
  const Temp std_dev = t.NewTemp();
  t.Run(Op::kSqrt, std_dev.ref(), sum, 0.0);                   // std = state_sum.sqrt()
  t.Run(Op::kAddScalar, std_dev.ref(), std_dev.ref(), h.eps);  //   .add_(eps)
  t.Run(Op::kAddcdiv, t.param(), t.param(), g, std_dev.ref(),
        -clr);  // param.addcdiv_(grad, std, value=-clr)
}

// lion-pytorch's update_fn (lion_pytorch/lion_pytorch.py); its decay runs even when wd == 0.
void StandardLion(const LionHyper& h, const Segment& s, const Runtime& rt) {
  const Tensors t(s, rt);
  Temp g_storage(s.param_dtype, 0);
  const TensorRef g = t.PrepareGrad(h.maximize, 0.0, &g_storage);
  const TensorRef m = t.state(kLionExpAvg);
  t.Run(Op::kMulScalar, t.param(), t.param(), 1.0 - h.lr * h.weight_decay);  // p.mul_(1-lr*wd)
  Temp update = t.NewTemp();
  t.Run(Op::kCopy, update.ref(), m, 0.0);                      // update = exp_avg.clone()
  t.Run(Op::kMulScalar, update.ref(), update.ref(), h.beta1);  //   .mul_(beta1)
  Temp sum = t.NewTemp();
  t.Run(Op::kAddScaled, sum.ref(), update.ref(), g, 1.0 - h.beta1);  //   .add(grad, alpha=1-b1)
  update = std::move(sum);                                           //   (the clone is freed)
  t.Sign(update.ref(), update.ref());                                //   .sgn_()
  t.Run(Op::kAddScaled, t.param(), t.param(), update.ref(), -h.lr);  // p.add_(update, alpha=-lr)
  t.Run(Op::kMulScalar, m, m, h.beta2);                              // exp_avg.mul_(beta2)
  t.Run(Op::kAddScaled, m, m, g, 1.0 - h.beta2);                     //   .add_(grad, alpha=1-beta2)
}

// The global gradient norm of tools/lamb_reference.py (apex FusedLAMB's max_grad_norm): per tensor
// vector_norm (one read), combined over the tensors; the clip factor, 1 when no clipping.
float LambClip(double max_grad_norm, std::span<const Segment> segments, const Runtime& rt) {
  double total = 0.0;
  for (const Segment& s : segments) {
    const Tensors t(s, rt);
    const double norm = t.Norm(t.grad());
    total += norm * norm;
  }
  return LambClipCoefficient(std::sqrt(total), max_grad_norm);
}

// tools/lamb_reference.py's step for one tensor, every line one op (a new tensor where the
// reference makes one), the clip factor `coef` from LambClip.
void StandardLamb(const LambHyper& h, float coef, const Segment& s, const Runtime& rt) {
  const Tensors t(s, rt);
  const bool wd = h.weight_decay != 0.0;
  Temp sg = t.NewTemp();
  if (coef != 1.0f) {
    t.Run(Op::kMulScalar, sg.ref(), t.grad(), coef);  // sg = torch.mul(g, coef)
  } else {
    t.Run(Op::kCopy, sg.ref(), t.grad(), 0.0);  // sg = g.clone()
  }
  if (!h.adam_w_mode && wd) {
    Temp decayed = t.NewTemp();
    t.Run(Op::kAddScaled, decayed.ref(), sg.ref(), t.param(), h.weight_decay);  // sg.add(p, wd)
    sg = std::move(decayed);
  }
  const TensorRef m = t.state(kLambExpAvg);
  const TensorRef v = t.state(kLambExpAvgSq);
  const double beta3 = h.grad_averaging ? 1.0 - h.beta1 : 1.0;
  t.Run(Op::kMulScalar, m, m, h.beta1);                          // exp_avg.mul_(b1)
  t.Run(Op::kAddScaled, m, m, sg.ref(), beta3);                  //   .add_(sg, alpha=b3)
  t.Run(Op::kMulScalar, v, v, h.beta2);                          // exp_avg_sq.mul_(b2)
  t.Run(Op::kAddcmul, v, v, sg.ref(), sg.ref(), 1.0 - h.beta2);  //   .addcmul_(sg, sg, 1-b2)
  const auto step = static_cast<double>(s.step);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, step) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, step) : 1.0;
  // u = (exp_avg / bc1) / ((exp_avg_sq / bc2).sqrt() + eps), each op a new tensor, each freed
  // once the next one is made (Python drops the intermediates as it goes).
  const Temp m_hat = t.NewTemp();
  t.Run(Op::kDivScalar, m_hat.ref(), m, bc1);  // exp_avg / bc1
  Temp denom = t.NewTemp();
  t.Run(Op::kDivScalar, denom.ref(), v, bc2);  // exp_avg_sq / bc2
  {
    Temp root = t.NewTemp();
    t.Run(Op::kSqrt, root.ref(), denom.ref(), 0.0);  //   .sqrt()
    denom = std::move(root);
  }
  {
    Temp shifted = t.NewTemp();
    t.Run(Op::kAddScalar, shifted.ref(), denom.ref(), h.eps);  //   + eps
    denom = std::move(shifted);
  }
  const Temp u = t.NewTemp();
  t.Div(u.ref(), m_hat.ref(), denom.ref());  // u = m_hat / denom
  if (h.adam_w_mode && wd)
    t.Run(Op::kAddScaled, u.ref(), u.ref(), t.param(), h.weight_decay);  // u.add_(p, alpha=wd)
  const double param_norm = t.Norm(t.param());                           // p.norm()
  const double update_norm = t.Norm(u.ref());                            // u.norm()
  const bool trust = (h.use_nvlamb || wd) && param_norm != 0.0 && update_norm != 0.0;
  const double ratio = trust ? h.lr * (param_norm / update_norm) : h.lr;
  t.Run(Op::kAddScaled, t.param(), t.param(), u.ref(), -ratio);  // p.add_(u, alpha=-ratio)
}

}  // namespace

Algorithm ParseAlgorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::kSgd, Algorithm::kAdam, Algorithm::kAdamW, Algorithm::kRmsprop,
                      Algorithm::kAdagrad, Algorithm::kLion, Algorithm::kLamb}) {
    if (name == AlgorithmName(a)) return a;
  }
  throw std::invalid_argument("unknown optimizer '" + std::string(name) +
                              "'; known: sgd, adam, adamw, rmsprop, adagrad, lion, lamb");
}

std::string_view AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kSgd:
      return "sgd";
    case Algorithm::kAdam:
      return "adam";
    case Algorithm::kAdamW:
      return "adamw";
    case Algorithm::kRmsprop:
      return "rmsprop";
    case Algorithm::kAdagrad:
      return "adagrad";
    case Algorithm::kLion:
      return "lion";
    case Algorithm::kLamb:
      return "lamb";
  }
  return "unknown";
}

bool HasReductionPass(Algorithm a) { return a == Algorithm::kLamb; }

unsigned BenchRequiredStates(Algorithm a, const BenchHyper& h) {
  switch (a) {
    case Algorithm::kSgd:
      return RequiredStates(h.sgd);
    case Algorithm::kAdam:
      return RequiredStates(h.adam);
    case Algorithm::kAdamW:
      return RequiredStates(h.adamw);
    case Algorithm::kRmsprop:
      return RequiredStates(h.rmsprop);
    case Algorithm::kAdagrad:
      return RequiredStates(h.adagrad);
    case Algorithm::kLion:
      return RequiredStates(h.lion);
    case Algorithm::kLamb:
      return RequiredStates(h.lamb);
  }
  return 0;
}

// Calls f(groups) with the one-group span of the algorithm's hyper-parameters.
template <class F>
static decltype(auto) WithGroups(Algorithm a, const BenchHyper& h, const F& f) {
  switch (a) {
    case Algorithm::kSgd:
      return f(std::span<const SgdHyper>(&h.sgd, 1));
    case Algorithm::kAdam:
      return f(std::span<const AdamHyper>(&h.adam, 1));
    case Algorithm::kAdamW:
      return f(std::span<const AdamWHyper>(&h.adamw, 1));
    case Algorithm::kRmsprop:
      return f(std::span<const RmspropHyper>(&h.rmsprop, 1));
    case Algorithm::kAdagrad:
      return f(std::span<const AdagradHyper>(&h.adagrad, 1));
    case Algorithm::kLion:
      return f(std::span<const LionHyper>(&h.lion, 1));
    case Algorithm::kLamb:
      break;
  }
  return f(std::span<const LambHyper>(&h.lamb, 1));
}

void FusedStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
               Runtime& runtime) {
  WithGroups(a, h, [&](auto groups) { fusedopt::FusedStep(groups, segments, runtime); });
}

StepResult FusedTrainingStep(Algorithm a, const BenchHyper& h, std::span<Segment> segments,
                             const TrainingStepOptions& options, Runtime& runtime) {
  return WithGroups(a, h,
                    [&](auto groups) { return TrainingStep(groups, segments, options, runtime); });
}

void StandardStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
                  const Runtime& runtime) {
  // LAMB's global gradient norm comes first, over all tensors, before any update.
  const float lamb_coef =
      a == Algorithm::kLamb ? LambClip(h.lamb_max_grad_norm, segments, runtime) : 1.0f;
  for (const Segment& s : segments) {
    switch (a) {
      case Algorithm::kSgd:
        StandardSgd(h.sgd, s, runtime);
        break;
      case Algorithm::kAdam:
        StandardAdam(h.adam, s, runtime);
        break;
      case Algorithm::kAdamW:
        StandardAdam(h.adamw.ToAdam(), s, runtime);
        break;
      case Algorithm::kRmsprop:
        StandardRmsprop(h.rmsprop, s, runtime);
        break;
      case Algorithm::kAdagrad:
        StandardAdagrad(h.adagrad, s, runtime);
        break;
      case Algorithm::kLion:
        StandardLion(h.lion, s, runtime);
        break;
      case Algorithm::kLamb:
        StandardLamb(h.lamb, lamb_coef, s, runtime);
        break;
    }
  }
}

}  // namespace fusedopt::bench
#endif  // HWY_ONCE
