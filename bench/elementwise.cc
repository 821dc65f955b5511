// Per-target loops of the elementary ops (see elementwise.h).

#include "bench/elementwise.h"

#include <algorithm>

#include "src/core/parallel.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using fusedopt::HWY_NAMESPACE::ForEachVector;
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
      case Op::kCopy:
        return Map<T, 1>(out, a, b, c, begin, end,
                         [](auto, auto x, auto, auto) HWY_ATTR { return x; });
    }
  });
}

}  // namespace fusedopt::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt::bench {
HWY_EXPORT(OpRange);

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

}  // namespace fusedopt::bench
#endif
