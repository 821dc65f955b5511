#include "bench/standard.h"

#include <cmath>
#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "bench/elementwise.h"

namespace fusedopt::bench {
namespace {

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

}  // namespace

Algorithm ParseAlgorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::kSgd, Algorithm::kAdam, Algorithm::kAdamW, Algorithm::kRmsprop,
                      Algorithm::kAdagrad}) {
    if (name == AlgorithmName(a)) return a;
  }
  throw std::invalid_argument("unknown optimizer '" + std::string(name) +
                              "'; known: sgd, adam, adamw, rmsprop, adagrad");
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
  }
  return "unknown";
}

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
  }
  return 0;
}

void FusedStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
               Runtime& runtime) {
  switch (a) {
    case Algorithm::kSgd:
      return SgdStep({&h.sgd, 1}, segments, runtime);
    case Algorithm::kAdam:
      return AdamStep({&h.adam, 1}, segments, runtime);
    case Algorithm::kAdamW:
      return AdamWStep({&h.adamw, 1}, segments, runtime);
    case Algorithm::kRmsprop:
      return RmspropStep({&h.rmsprop, 1}, segments, runtime);
    case Algorithm::kAdagrad:
      return AdagradStep({&h.adagrad, 1}, segments, runtime);
  }
}

void StandardStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
                  const Runtime& runtime) {
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
    }
  }
}

}  // namespace fusedopt::bench
