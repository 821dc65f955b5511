// ConvertBuffer: Io<Src>::Load then Io<Dst>::Store, per SIMD target.

#include "fusedopt/convert.h"

#include <algorithm>
#include <string>

#include "fusedopt/error.h"
#include "src/core/parallel.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {

void ConvertRange(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t begin,
                  std::size_t end) {
  WithStorageType(src_dtype, [&](auto src_tag) HWY_ATTR {
    WithStorageType(dst_dtype, [&](auto dst_tag) HWY_ATTR {
      using Src = typename decltype(src_tag)::type;
      using Dst = typename decltype(dst_tag)::type;
      const Src* in = static_cast<const Src*>(src);
      Dst* out = static_cast<Dst*>(dst);
      ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
        Io<Dst>::Store(d, Io<Src>::Load(d, in + i), out + i);
      });
    });
  });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(ConvertRange);

void ConvertBuffer(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
                   Runtime& runtime) {
  for (DType t : {src_dtype, dst_dtype}) {
    if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
      throw Error("ConvertBuffer: invalid dtype code " + std::to_string(static_cast<int>(t)));
    }
  }
  if (n != 0 && (src == nullptr || dst == nullptr)) {
    throw Error("ConvertBuffer: null buffer with n = " + std::to_string(n));
  }
  const std::size_t chunks = (n + kGrainElements - 1) / kGrainElements;
  ParallelForChunks(chunks, runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    HWY_DYNAMIC_DISPATCH(ConvertRange)
    (src, src_dtype, dst, dst_dtype, c0 * kGrainElements, std::min(c1 * kGrainElements, n));
  });
}

}  // namespace fusedopt
#endif
