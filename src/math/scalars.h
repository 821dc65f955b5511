// What every math body (src/math/<algo>_math.h) may use besides its algorithm's Scalars struct
// (the per-tensor f32 coefficients, computed on the host in double and rounded once, exactly where
// the reference rounds its Python-float scalars; declared with the algorithm's descriptor,
// src/algos/<algo>.h): the device marker and lerp's coefficients.
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

}  // namespace fusedopt
