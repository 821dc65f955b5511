// Small helpers shared by the benchmark runner, the doctor and `fusedopt train`: medians, trimmed
// means, number formatting, deterministic buffer fills, checked size arithmetic and checked report
// writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"

namespace fusedopt::tools {

// The median (the mean of the two middle values for an even count); 0 for no values.
double Median(std::vector<double> values);

// The mean after dropping floor(n * trim) values at each end: robust to a shared machine's hiccups
// like the median, and, unlike medians, additive (the phases' trimmed means about sum to the
// step's), which the training tables need. 0 for no values.
double TrimmedMean(std::vector<double> values, double trim = 0.1);

// `value` with `digits` decimals: Fixed(1.23456, 2) == "1.23".
std::string Fixed(double value, int digits);

// A number as ostream writes it, for messages: "1e-05", "0.25", "-1", "nan".
std::string Num(double value);

// 4231976 -> "4,231,976".
std::string FormatCount(std::size_t n);

// Sizes that come from the command line or a file, checked before anything is allocated (a wrapped
// byte count allocates a small buffer that the fill then overruns). Each throws
// std::invalid_argument "<what>: ..." when the exact result does not fit in std::size_t.
std::size_t CheckedMul(std::size_t a, std::size_t b, const std::string& what);
std::size_t CheckedAdd(std::size_t a, std::size_t b, const std::string& what);

// Throws std::invalid_argument "<what>: needs N GiB, this machine has M GiB" when `bytes` exceed
// the machine's physical memory: a clear message instead of std::bad_alloc or the OOM killer.
void CheckFitsInMemory(std::size_t bytes, const std::string& what);

// Writes a report file, creating its folder, so that the file is either complete or untouched: a
// regular path is written to a temporary file in the same folder, flushed, closed and renamed over
// it; an existing non-regular file (a device such as /dev/null or /dev/full, a pipe) is written in
// place, since it cannot be replaced. Every step is checked: a failure throws std::runtime_error
// with the path and the OS's reason, and leaves no temporary file behind.
void WriteTextFile(const std::string& path, const std::string& text);

// Throws std::runtime_error with the path and the OS's reason if WriteTextFile(path) could not
// create the file (its nearest existing folder is not writable, or a parent is not a folder), and
// creates nothing: for failing before a long run rather than after it.
void CheckWritable(const std::string& path);

// Deterministic values in [-scale, scale) written as `dtype`: timings only need ordinary numbers.
void Fill(void* data, DType dtype, std::size_t n, float scale, std::uint32_t seed);

}  // namespace fusedopt::tools
