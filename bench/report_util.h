// Small helpers shared by the benchmark runner, the doctor and `fusedopt train`: medians, trimmed
// means, number formatting and deterministic buffer fills.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"

namespace fusedopt::bench {

// The median (the mean of the two middle values for an even count); 0 for no values.
double Median(std::vector<double> values);

// The mean after dropping floor(n * trim) values at each end: robust to a shared machine's hiccups
// like the median, and, unlike medians, additive (the phases' trimmed means about sum to the
// step's), which the training tables need. 0 for no values.
double TrimmedMean(std::vector<double> values, double trim = 0.1);

// `value` with `digits` decimals: Fixed(1.23456, 2) == "1.23".
std::string Fixed(double value, int digits);

// 4231976 -> "4,231,976".
std::string FormatCount(std::size_t n);

// Deterministic values in [-scale, scale) written as `dtype`: timings only need ordinary numbers.
void Fill(void* data, DType dtype, std::size_t n, float scale, std::uint32_t seed);

}  // namespace fusedopt::bench
