// The traffic kernels (same_traffic.cc): per element, the bytes a fused step reads and writes (for
// a two-phase step, its read-only reduction pass too), with one multiply-add of math, built like
// the real kernels (src/cpu/loop-inl.h: the step's chunks and threads, one loop per dtype
// combination, state count and store kind). `fusedopt bench` takes the fastest store kind as its
// memory-bandwidth ceiling; `fusedopt info --bandwidth` times the STREAM-style read, write and copy
// built on the same loops.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace fusedopt::baselines {

// How a traffic kernel writes: regular stores, or non-temporal ones for every full vector (they
// skip the read-for-ownership of the line, which can be the faster ceiling on large arrays).
enum class TrafficStores { kRegular, kStream };
inline constexpr TrafficStores kAllTrafficStores[] = {TrafficStores::kRegular,
                                                      TrafficStores::kStream};
const char* TrafficStoresName(TrafficStores stores);  // "store" or "stream"

// One step's traffic on every segment: x += c · g for the param and every allocated state, g the
// gradient. c = 0 keeps every value (barring Inf/NaN gradients): what benchmarks run between real
// steps on the same buffers. Ignores stochastic rounding. The segments are those `fusedopt bench`
// and the doctor time: states in the param's dtype (grads of any), no master; others throw
// std::invalid_argument.
void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime,
                     TrafficStores stores, float c = 0.0f);

// The traffic of a two-phase step's reduction pass (LAMB's Σp², Σu², HasReductionPass in
// standard.h), run before SameTrafficStep: the same loop over the same chunks reading what the
// step reads (the gradient, the param or its f32 master, every allocated state) and writing
// nothing, one add per loaded vector. Returns the sum of the loaded values (so the loads cannot be
// dropped).
float SameTrafficReduce(std::span<const Segment> segments, const Runtime& runtime);

// STREAM-style kernels on f32 arrays of n elements, in the step's chunks and threads.
double TrafficRead(const float* a, std::size_t n, const Runtime& runtime);  // returns the sum
void TrafficFill(float* a, std::size_t n, float value, const Runtime& runtime,
                 TrafficStores stores);
void TrafficCopy(const float* a, float* b, std::size_t n, const Runtime& runtime,
                 TrafficStores stores);

// The machine's read, write (fill) and copy bandwidth on arrays of array_bytes each: the best of
// `rounds` timed calls of each kernel, with all of runtime's threads. Write and copy report the
// faster store kind. GB/s are 1e9 bytes per second; copy counts the bytes read and written.
struct StreamBandwidth {
  std::size_t array_bytes = 0;
  int threads = 0;
  int rounds = 0;
  double read_gb_per_s = 0.0;
  double write_gb_per_s[2] = {};  // indexed by TrafficStores
  double copy_gb_per_s[2] = {};
};
StreamBandwidth MeasureStreamBandwidth(std::size_t array_bytes, int rounds, const Runtime& runtime);

}  // namespace fusedopt::baselines
