// Vectorized conversion between storage types, with the same round-to-nearest-even stores the
// optimizer kernels use (bit-identical to F32ToBF16/F32ToF16 in dtype.h on every SIMD target).
// Handy to seed f32 master copies or to cast a checkpoint.
#pragma once

#include <cstddef>

#include "fusedopt/dtype.h"
#include "fusedopt/runtime.h"

namespace fusedopt {

// dst[i] = round(src[i]) for i < n. Buffers must not overlap; null pointers are allowed only with n
// == 0.
void ConvertBuffer(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
                   Runtime& runtime = DefaultRuntime());

}  // namespace fusedopt
