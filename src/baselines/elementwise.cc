// Per-target loops of the elementary ops (see elementwise.h).

#include "src/baselines/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/core/parallel.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/baselines/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::baselines::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using fusedopt::HWY_NAMESPACE::ForEachVector;
using fusedopt::HWY_NAMESPACE::HwyOps;
using fusedopt::HWY_NAMESPACE::Io;
using fusedopt::HWY_NAMESPACE::WithStorageType;

// out[i] = f(a[i], b[i], c[i]) over [begin, end), reading only the inputs the op uses.
template <class T, int kInputs, class F>
HWY_INLINE void Map(T* out, const T* a, const T* b, const T* c, std::size_t begin, std::size_t end,
                    const F& f) {
  ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
    const auto va = Io<T>::Load(d, a + i);
    const auto vb = kInputs >= 2 ? Io<T>::Load(d, b + i) : va;
    const auto vc = kInputs >= 3 ? Io<T>::Load(d, c + i) : va;
    Io<T>::Store(d, f(d, va, vb, vc), out + i);
  });
}

void OpRange(Op op, void* out_data, const void* a_data, const void* b_data, const void* c_data,
             DType dtype, float s, std::size_t begin, std::size_t end) {
  WithStorageType(dtype, [&](auto tag) HWY_ATTR {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(out_data);
    const T* a = static_cast<const T*>(a_data);
    const T* b = static_cast<const T*>(b_data);
    const T* c = static_cast<const T*>(c_data);
    switch (op) {
      case Op::kMulScalar:
        return Map<T, 1>(out, a, b, c, begin, end, [s](auto d, auto x, auto, auto) HWY_ATTR {
          return hn::Mul(x, hn::Set(d, s));
        });
      case Op::kMul:
        return Map<T, 2>(out, a, b, c, begin, end,
                         [](auto, auto x, auto y, auto) HWY_ATTR { return hn::Mul(x, y); });
      case Op::kAddScaled:
        return Map<T, 2>(out, a, b, c, begin, end, [s](auto d, auto x, auto y, auto) HWY_ATTR {
          return hn::MulAdd(hn::Set(d, s), y, x);
        });
      case Op::kLerp:
        return Map<T, 2>(out, a, b, c, begin, end, [s](auto d, auto x, auto y, auto) HWY_ATTR {
          const auto diff = hn::Sub(y, x);
          return s < 0.5f ? hn::MulAdd(hn::Set(d, s), diff, x)
                          : hn::MulAdd(hn::Set(d, s - 1.0f), diff, y);
        });
      case Op::kAddcmul:
        return Map<T, 3>(out, a, b, c, begin, end, [s](auto d, auto x, auto y, auto z) HWY_ATTR {
          return hn::MulAdd(hn::Mul(hn::Set(d, s), y), z, x);
        });
      case Op::kAddcdiv:
        return Map<T, 3>(out, a, b, c, begin, end, [s](auto d, auto x, auto y, auto z) HWY_ATTR {
          return hn::Add(x, hn::Div(hn::Mul(hn::Set(d, s), y), z));
        });
      case Op::kSqrt:
        return Map<T, 1>(out, a, b, c, begin, end,
                         [](auto, auto x, auto, auto) HWY_ATTR { return hn::Sqrt(x); });
      case Op::kDivScalar:
        return Map<T, 1>(out, a, b, c, begin, end, [s](auto d, auto x, auto, auto) HWY_ATTR {
          return hn::Div(x, hn::Set(d, s));
        });
      case Op::kAddScalar:
        return Map<T, 1>(out, a, b, c, begin, end, [s](auto d, auto x, auto, auto) HWY_ATTR {
          return hn::Add(x, hn::Set(d, s));
        });
      case Op::kMaximum:
        return Map<T, 2>(out, a, b, c, begin, end,
                         [](auto, auto x, auto y, auto) HWY_ATTR { return hn::Max(x, y); });
      case Op::kNeg:
        return Map<T, 1>(out, a, b, c, begin, end,
                         [](auto, auto x, auto, auto) HWY_ATTR { return hn::Neg(x); });
      case Op::kAbs:
        return Map<T, 1>(out, a, b, c, begin, end,
                         [](auto, auto x, auto, auto) HWY_ATTR { return hn::Abs(x); });
      case Op::kReciprocal:
        return Map<T, 1>(out, a, b, c, begin, end, [](auto d, auto x, auto, auto) HWY_ATTR {
          return hn::Div(hn::Set(d, 1.0f), x);
        });
      case Op::kCopy:
        return Map<T, 1>(out, a, b, c, begin, end,
                         [](auto, auto x, auto, auto) HWY_ATTR { return x; });
    }
  });
}

// out[i] = a[i] converted from a's dtype to out's (f32 in between; stores round to nearest even).
void ConvertRange(void* out_data, DType out_dtype, const void* a_data, DType a_dtype,
                  std::size_t begin, std::size_t end) {
  WithStorageType(out_dtype, [&](auto out_tag) HWY_ATTR {
    using O = typename decltype(out_tag)::type;
    WithStorageType(a_dtype, [&](auto a_tag) HWY_ATTR {
      using A = typename decltype(a_tag)::type;
      O* out = static_cast<O*>(out_data);
      const A* a = static_cast<const A*>(a_data);
      ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
        Io<O>::Store(d, Io<A>::Load(d, a + i), out + i);
      });
    });
  });
}

// Whether a[begin, end) holds +-Inf or NaN: x − x is 0 for finite x and NaN otherwise, so one
// running sum of it is NaN exactly when some element is not finite.
bool NonFiniteRange(const void* a_data, DType dtype, std::size_t begin, std::size_t end) {
  bool found = false;
  WithStorageType(dtype, [&](auto tag) HWY_ATTR {
    using T = typename decltype(tag)::type;
    const T* a = static_cast<const T*>(a_data);
    const hn::ScalableTag<float> d;
    auto poison = hn::Zero(d);
    auto poison1 = hn::Zero(hn::CappedTag<float, 1>());
    ForEachVector(begin, end, [&](auto dv, std::size_t i) HWY_ATTR {
      const auto x = Io<T>::Load(dv, a + i);
      if constexpr (hn::MaxLanes(dv) == 1) {
        poison1 = hn::Add(poison1, hn::Sub(x, x));
      } else {
        poison = hn::Add(poison, hn::Sub(x, x));
      }
    });
    const float total = hn::GetLane(hn::SumOfLanes(d, poison)) + hn::GetLane(poison1);
    found = total != total;
  });
  return found;
}

// Sum of a[i]² over [begin, end) in f32: two vector accumulators (so the fma latency does not bound
// the loop), then a 1-lane tail.
float SumSquaresRange(const void* a_data, DType dtype, std::size_t begin, std::size_t end) {
  float result = 0.0f;
  WithStorageType(dtype, [&](auto tag) HWY_ATTR {
    using T = typename decltype(tag)::type;
    const T* a = static_cast<const T*>(a_data);
    const hn::ScalableTag<float> d;
    const std::size_t lanes = hn::Lanes(d);
    auto acc0 = hn::Zero(d);
    auto acc1 = hn::Zero(d);
    std::size_t i = begin;
    for (; i + 2 * lanes <= end; i += 2 * lanes) {
      const auto x0 = Io<T>::Load(d, a + i);
      const auto x1 = Io<T>::Load(d, a + i + lanes);
      acc0 = hn::MulAdd(x0, x0, acc0);
      acc1 = hn::MulAdd(x1, x1, acc1);
    }
    const hn::CappedTag<float, 1> d1;
    auto acc_tail = hn::Zero(d1);
    for (; i < end; ++i) {
      const auto x = Io<T>::Load(d1, a + i);
      acc_tail = hn::MulAdd(x, x, acc_tail);
    }
    result = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1))) + hn::GetLane(acc_tail);
  });
  return result;
}

void BaselineOpRange(BaselineOp op, const BaselineArgs& args, void* out_data, const void* a_data,
                     const void* b_data, DType dtype, std::size_t begin, std::size_t end) {
  WithStorageType(dtype, [&](auto tag) HWY_ATTR {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(out_data);
    const T* a = static_cast<const T*>(a_data);
    const T* b = static_cast<const T*>(b_data);
    switch (op) {
      case BaselineOp::kDivide:
        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
          Io<T>::Store(d, hn::Div(Io<T>::Load(d, a + i), Io<T>::Load(d, b + i)), out + i);
        });
        return;
      case BaselineOp::kRsqrt:
        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
          const HwyOps<decltype(d)> o{d};
          Io<T>::Store(d, o.Div(o.Set(1.0f), o.Sqrt(Io<T>::Load(d, a + i))), out + i);
        });
        return;
      case BaselineOp::kSign:
        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
          Io<T>::Store(d, HwyOps<decltype(d)>{d}.Sign(Io<T>::Load(d, a + i)), out + i);
        });
        return;
      case BaselineOp::kClamp:
        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
          const HwyOps<decltype(d)> o{d};
          Io<T>::Store(d, o.Min(o.Max(Io<T>::Load(d, a + i), o.Set(args.lo)), o.Set(args.hi)),
                       out + i);
        });
        return;
      case BaselineOp::kMaskedFill: {
        // out = (b cmp threshold) ? value : a, the comparison chosen outside the loop.
        const auto fill = [&](const auto& compare) HWY_ATTR {
          ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
            const HwyOps<decltype(d)> o{d};
            const auto mask = compare(o, Io<T>::Load(d, b + i), o.Set(args.threshold));
            Io<T>::Store(d, o.IfThenElse(mask, o.Set(args.value), Io<T>::Load(d, a + i)), out + i);
          });
        };
        switch (args.compare) {
          case algos::Compare::kGt:
            return fill([](const auto& o, auto c, auto t) HWY_ATTR { return o.Gt(c, t); });
          case algos::Compare::kLt:
            return fill([](const auto& o, auto c, auto t) HWY_ATTR { return o.Lt(c, t); });
          case algos::Compare::kEq:
            return fill([](const auto& o, auto c, auto t) HWY_ATTR { return o.Eq(c, t); });
        }
        return;
      }
    }
  });
}

}  // namespace fusedopt::baselines::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt::baselines {
HWY_EXPORT(OpRange);
HWY_EXPORT(ConvertRange);
HWY_EXPORT(NonFiniteRange);
HWY_EXPORT(SumSquaresRange);
HWY_EXPORT(BaselineOpRange);

namespace {

std::size_t NumChunks(std::size_t n) { return (n + kGrainElements - 1) / kGrainElements; }

}  // namespace

void RunOp(Op op, TensorRef out, TensorRef a, TensorRef b, TensorRef c, float s,
           const Runtime& runtime) {
  const std::size_t n = out.numel;
  const std::size_t chunks = (n + kGrainElements - 1) / kGrainElements;
  ParallelForChunks(chunks, runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    HWY_DYNAMIC_DISPATCH(OpRange)
    (op, out.data, a.data, b.data, c.data, out.dtype, s, c0 * kGrainElements,
     std::min(c1 * kGrainElements, n));
  });
}

void RunBaselineOp(BaselineOp op, TensorRef out, TensorRef a, TensorRef b, const Runtime& runtime,
                   const BaselineArgs& args) {
  const std::size_t n = out.numel;
  const std::size_t chunks = (n + kGrainElements - 1) / kGrainElements;
  ParallelForChunks(chunks, runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    HWY_DYNAMIC_DISPATCH(BaselineOpRange)
    (op, args, out.data, a.data, b.data, out.dtype, c0 * kGrainElements,
     std::min(c1 * kGrainElements, n));
  });
}

void RunConvert(TensorRef out, TensorRef a, const Runtime& runtime) {
  const std::size_t n = out.numel;
  ParallelForChunks(NumChunks(n), runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    HWY_DYNAMIC_DISPATCH(ConvertRange)
    (out.data, out.dtype, a.data, a.dtype, c0 * kGrainElements, std::min(c1 * kGrainElements, n));
  });
}

bool RunNonFiniteCheck(TensorRef a, const Runtime& runtime) {
  const std::size_t n = a.numel;
  std::vector<char> found(NumChunks(n), 0);  // one flag per grain, written by its thread
  ParallelForChunks(found.size(), runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c) {
      found[c] = HWY_DYNAMIC_DISPATCH(NonFiniteRange)(a.data, a.dtype, c * kGrainElements,
                                                      std::min((c + 1) * kGrainElements, n))
                     ? 1
                     : 0;
    }
  });
  return std::any_of(found.begin(), found.end(), [](char f) { return f != 0; });
}

float RunNorm2(TensorRef a, const Runtime& runtime) {
  const std::size_t n = a.numel;
  std::vector<float> partial(NumChunks(n), 0.0f);
  ParallelForChunks(partial.size(), runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c) {
      partial[c] = HWY_DYNAMIC_DISPATCH(SumSquaresRange)(a.data, a.dtype, c * kGrainElements,
                                                         std::min((c + 1) * kGrainElements, n));
    }
  });
  float sum = 0.0f;
  for (const float p : partial) sum += p;
  return std::sqrt(sum);
}

}  // namespace fusedopt::baselines
#endif
