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

// One way to run a step's traffic: its stores, and its pace, a chain of `pace` dependent divisions
// per vector between the loads and the stores whose result is only summed. Why pace a loop that
// exists to be fast: on the 2-core Zen 4 a loop that issues its loads and stores back to back moved
// a step's bytes 8-12% slower than the same loop with four divisions per vector (and with more it
// became compute-bound), so the loop with the least math is not the fastest, and real kernels beat
// it (fraction up to 1.10). `fusedopt bench` times every loop of kAllTrafficLoops and takes the
// fastest as its ceiling.
struct TrafficLoop {
  TrafficStores stores = TrafficStores::kRegular;
  int pace = 0;
};
inline constexpr TrafficLoop kAllTrafficLoops[] = {
    {TrafficStores::kRegular, 0}, {TrafficStores::kStream, 0},  {TrafficStores::kRegular, 2},
    {TrafficStores::kRegular, 3}, {TrafficStores::kRegular, 4}, {TrafficStores::kRegular, 6}};
std::string TrafficLoopName(TrafficLoop loop);  // "store", "stream", "store_pace4"

// One step's traffic on every segment, run as `loop`: x += c · g for the param and every allocated
// state, g the gradient. c = 0 keeps every value (barring Inf/NaN gradients): what benchmarks run
// between real steps on the same buffers. Ignores stochastic rounding. The segments are those
// `fusedopt bench` and the doctor time: states in the param's dtype (grads of any), or 8-bit
// states (state_dtype kQ8, fusedopt/quantize.h), no master; others throw std::invalid_argument.
// 8-bit states move the 8-bit step's bytes: per element each state's code (1 B read, 1 B written,
// code += c · g on the code's value 0..255, the new value truncated and saturated to a byte), and
// per block of kQuantBlock elements each state's absmax (4 B read, 4 B written, absmax += c ·
// absmax), a block's absmax moved by the piece that holds its first element, as the real step
// does. The store kinds and paces of `loop` apply to the elements; absmax uses regular stores.
void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime, TrafficLoop loop,
                     float c = 0.0f);

// The traffic of a two-phase step's reduction pass (LAMB's Σp², Σu², ReductionTraffic in
// standard.h), run before SameTrafficStep: the same loop over the same chunks reading the
// segments' gradient, param and every allocated state (8-bit states: each code, and the absmax
// of the blocks a piece owns), and writing nothing, one add per loaded vector, paced as
// TrafficLoop::pace says. Returns the sum of the loaded values (so the loads cannot be dropped). A
// pace below 0 throws std::invalid_argument.
float SameTrafficReduce(std::span<const Segment> segments, const Runtime& runtime, int pace = 0);

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
