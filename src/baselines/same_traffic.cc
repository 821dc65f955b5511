// same_traffic: the memory-bandwidth ceiling of the fused step (same_traffic.h). Built like the
// real kernels (src/cpu/loop-inl.h): one parallel region per step over the kGrainElements chunks,
// each piece of a segment run by a flattened loop instantiated for its storage types (8-bit states:
// u8 codes), its number of states, its store kind and whether it is paced, so the loop body tests
// nothing per vector (a paced loop runs its pace count). Its math is one multiply-add per written
// array (x + c·g), which keeps the loads live and, with c = 0, the values; a paced loop adds its
// chain of divisions (TrafficLoop). With 8-bit states a piece then reads and writes each state's
// absmax of the blocks it owns (x + c·x). SameTrafficReduce is the floor of a two-phase step's
// reduction pass (LAMB's Σp², Σu²): the same loop reading the same arrays (8-bit states: the codes
// and the absmax of the blocks a piece owns), storing nothing, one add per vector into a sum.
// SameTrafficGradRead is the floor of the fused pre-pass (GradPrePass) and of a reduction that
// reads the gradients only: one read of every gradient in the step's chunks, one add per vector,
// paced as the step.

#include "src/baselines/same_traffic.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/quantize.h"
#include "src/baselines/standard.h"
#include "src/core/parallel.h"
#include "src/core/plan.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/baselines/same_traffic.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::baselines::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using fusedopt::HWY_NAMESPACE::Io;
using fusedopt::HWY_NAMESPACE::WithFlags;
using fusedopt::HWY_NAMESPACE::WithStorageType;

// What a traffic loop moves per element: the step (grad read; param and states read and written),
// a reduction (the step's reads, nothing written), a copy (a read, p written) or a fill.
enum Kind : int { kStep, kCopy, kFill, kReduce };

// Loads T as an f32 vector: Io<T> for f32, f16 and bf16; an 8-bit state's codes (u8) widened to
// i32 and converted, the codes' values 0..255 (not the states they stand for: a traffic loop needs
// the bytes, not the map).
template <class T, class DF>
HWY_INLINE hn::Vec<DF> TrafficLoad(DF df, const T* p) {
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    const hn::RebindToSigned<DF> di;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::uint8_t, DF>(), p)));
  } else {
    return Io<T>::Load(df, p);
  }
}

// An f32 vector as the lanes of T that are stored: 16-bit values by Highway's demotion, which
// truncates (not the real kernels' rounding: enough for values that c = 0 leaves exact); codes by
// truncation to i32, then the saturating demotion to u8 (exact for the whole numbers 0..255).
template <class T, class DF>
HWY_INLINE auto TrafficDemote(DF /*df*/, hn::Vec<DF> v) {
  const hn::Rebind<T, DF> dt;
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return hn::DemoteTo(dt, hn::ConvertTo(hn::RebindToSigned<DF>(), v));
  } else {
    return hn::DemoteTo(dt, v);
  }
}

// Stores an f32 vector as T (TrafficDemote). Stream needs an aligned address (the caller's job)
// and, in Highway 1.0.3 on x86, writes 16 bytes even for a smaller vector: those stay regular
// stores.
template <class T, bool kStream, class DF>
HWY_INLINE void TrafficStore(DF df, hn::Vec<DF> v, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    if constexpr (kStream) {
      hn::Stream(v, df, p);
    } else {
      hn::StoreU(v, df, p);
    }
  } else {
    const hn::Rebind<T, DF> dt;
    if constexpr (kStream && hn::MaxLanes(hn::Rebind<T, DF>()) * sizeof(T) >= 16) {
      hn::Stream(TrafficDemote<T>(df, v), dt, p);
    } else {
      hn::StoreU(TrafficDemote<T>(df, v), dt, p);
    }
  }
}

// The pace of a paced loop (TrafficLoop): g / (|g| + 1)^pace, one division at a time; finite for a
// finite g, never subnormal for the gradients benchmarks fill (a subnormal operand can take a slow
// path).
template <class V>
HWY_INLINE V PaceChain(V grad, int pace) {
  const auto divisor = hn::Add(hn::Abs(grad), hn::Set(hn::DFromV<V>(), 1.0f));
  V chain = grad;
  for (int k = 0; k < pace; ++k) chain = hn::Div(chain, divisor);
  return chain;
}

template <class T>
HWY_INLINE bool IsAligned(const T* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// One piece [begin, end) of a segment, flattened like RunPiece (loop-inl.h): full vectors, then
// 1-lane vectors for the tail. With kStream the full vectors use non-temporal stores once 1-lane
// steps (at most one vector's worth) have aligned every written array; arrays that never align at
// the same index keep regular stores. kPaced (a step's loop): `pace` divisions per vector
// (TrafficLoop). S is the states' storage type: P, or std::uint8_t for 8-bit states (a step's or a
// reduction's loop), whose absmax of the blocks the piece owns are then read and written (read, by
// a reduction) too. Returns the sum of the loaded values for kReduce, of the pace chains' results
// for kPaced, else 0.
template <int kKind, class G, class P, class S, int kStates, bool kStream, bool kPaced = false>
HWY_NOINLINE FOPT_FLATTEN float TrafficPiece(const Segment& seg, float c, int pace,
                                             std::size_t begin, std::size_t end) {
  static_assert(kKind != kReduce || !kStream, "a reduction stores nothing");
  static_assert(!kPaced || ((kKind == kStep || kKind == kReduce) && !kStream),
                "only a step's loops are paced, with regular stores");
  constexpr bool kQ8 = std::is_same_v<S, std::uint8_t>;
  static_assert(
      std::is_same_v<S, P> || (kQ8 && (kKind == kStep || kKind == kReduce) && kStates > 0),
      "states of another type than the param's are a step's or reduction's 8-bit codes");
  const G* g = static_cast<const G*>(seg.grad);
  P* p = static_cast<P*>(seg.param);
  std::array<S*, kStates> s{};           // the allocated slots, in slot order
  std::array<float*, kStates> absmax{};  // 8-bit states: each one's absmax
  for (int slot = 0, k = 0; slot < kMaxStates && k < kStates; ++slot) {
    if (seg.state[slot] == nullptr) continue;
    absmax[k] = seg.absmax[slot];
    s[k++] = static_cast<S*>(seg.state[slot]);
  }
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  // kReduce and kPaced: one running sum per vector type (full vectors, the 1-lane tail), so each
  // vector costs one add on the loop-carried chain.
  auto acc = hn::Zero(d);
  auto acc1 = hn::Zero(d1);
  const auto accumulate = [&](auto v) HWY_ATTR {
    if constexpr (hn::MaxLanes(hn::DFromV<decltype(v)>()) == 1) {
      acc1 = hn::Add(acc1, v);
    } else {
      acc = hn::Add(acc, v);
    }
  };
  const auto body = [&](auto dv, std::size_t i, auto stream) HWY_ATTR {
    constexpr bool kNt = decltype(stream)::value;
    if constexpr (kKind == kFill) {
      TrafficStore<P, kNt>(dv, hn::Set(dv, c), p + i);
      return;
    }
    const auto grad = Io<G>::Load(dv, g + i);
    if constexpr (kPaced) accumulate(PaceChain(grad, pace));
    if constexpr (kKind == kReduce) {
      // The step's loads (grad, param, each state), added up, then one add into the sum.
      auto sum = hn::Add(grad, Io<P>::Load(dv, p + i));
      for (int k = 0; k < kStates; ++k) sum = hn::Add(sum, TrafficLoad(dv, s[k] + i));
      accumulate(sum);
    } else {
      const auto v = hn::Mul(grad, hn::Set(dv, c));
      if constexpr (kKind == kCopy) {
        TrafficStore<P, kNt>(dv, v, p + i);
      } else {
        // Every load before the first store, as in the real kernels: no store sits between loads
        // that the CPU must then check for aliasing.
        const auto x = hn::Add(Io<P>::Load(dv, p + i), v);
        const auto state = [&](auto k) HWY_ATTR {
          if constexpr (decltype(k)::value < kStates) {
            return hn::Add(TrafficLoad(dv, s[decltype(k)::value] + i), v);
          } else {
            return v;  // no such state: never stored
          }
        };
        const auto x0 = state(std::integral_constant<int, 0>{});
        const auto x1 = state(std::integral_constant<int, 1>{});
        const auto x2 = state(std::integral_constant<int, 2>{});
        static_assert(kMaxStates == 3);
        TrafficStore<P, kNt>(dv, x, p + i);
        if constexpr (kStates > 0) TrafficStore<S, kNt>(dv, x0, s[0] + i);
        if constexpr (kStates > 1) TrafficStore<S, kNt>(dv, x1, s[1] + i);
        if constexpr (kStates > 2) TrafficStore<S, kNt>(dv, x2, s[2] + i);
      }
    }
  };
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = begin;
  if constexpr (kStream) {
    const auto aligned = [&](std::size_t at) HWY_ATTR {
      bool ok = IsAligned(p + at, lanes * sizeof(P));
      for (int k = 0; k < kStates; ++k) ok = ok && IsAligned(s[k] + at, lanes * sizeof(S));
      return ok;
    };
    const std::size_t peel_end = std::min(end, begin + lanes);
    while (i < peel_end && !aligned(i)) body(d1, i++, std::false_type{});
    if (aligned(i)) {
      for (; i + lanes <= end; i += lanes) body(d, i, std::true_type{});
    }
  }
  for (; i + lanes <= end; i += lanes) body(d, i, std::false_type{});
  for (; i < end; ++i) body(d1, i, std::false_type{});
  if constexpr (kQ8) {
    // The absmax of the blocks whose first element lies in [begin, end), as the real step's
    // RunQuantizedPiece runs a block whole in the piece that holds its first element: each read
    // and written once, x + c·x (kept with c = 0), with regular stores (1/64 of the codes' bytes,
    // seldom aligned with them).
    const std::size_t block_end = (end + kQuantBlock - 1) / kQuantBlock;
    const auto absmax_body = [&](auto dv, std::size_t b) HWY_ATTR {
      if constexpr (kKind == kReduce) {
        for (int k = 0; k < kStates; ++k) accumulate(hn::LoadU(dv, absmax[k] + b));
        return;
      }
      const auto cv = hn::Set(dv, c);
      const auto scaled = [&](auto k) HWY_ATTR {
        if constexpr (decltype(k)::value < kStates) {
          const auto a = hn::LoadU(dv, absmax[decltype(k)::value] + b);
          return hn::Add(a, hn::Mul(a, cv));
        } else {
          return cv;  // no such state: never stored
        }
      };
      const auto a0 = scaled(std::integral_constant<int, 0>{});
      const auto a1 = scaled(std::integral_constant<int, 1>{});
      const auto a2 = scaled(std::integral_constant<int, 2>{});
      hn::StoreU(a0, dv, absmax[0] + b);
      if constexpr (kStates > 1) hn::StoreU(a1, dv, absmax[1] + b);
      if constexpr (kStates > 2) hn::StoreU(a2, dv, absmax[2] + b);
    };
    std::size_t b = (begin + kQuantBlock - 1) / kQuantBlock;
    for (; b + lanes <= block_end; b += lanes) absmax_body(d, b);
    for (; b < block_end; ++b) absmax_body(d1, b);
  }
  return hn::GetLane(hn::SumOfLanes(d, acc)) + hn::GetLane(acc1);
}

// Calls f(std::integral_constant<int, n>) for n = count in [0, kMaxStates].
template <class F>
HWY_INLINE void WithStateCount(int count, const F& f) {
  static_assert(kMaxStates == 3);
  switch (count) {
    case 0:
      return f(std::integral_constant<int, 0>{});
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      return f(std::integral_constant<int, 3>{});
  }
}

// Runs TrafficPiece<kKind, G, P, S, kStates, kNt, kPaced> on one piece of a step's segment, the
// template arguments from the segment (its storage types and allocated states); returns its sum.
// The loops exist for the segments `fusedopt bench` and the doctor time, states in the param's
// dtype or 8-bit states, and no master (CheckTrafficSegments), not for all 45
// dtype and master combinations.
template <int kKind, bool kNt, bool kPaced = false>
HWY_INLINE float SegmentTrafficPiece(const Segment& seg, float c, int pace, std::size_t begin,
                                     std::size_t end) {
  int states = 0;
  for (const void* state : seg.state) states += state != nullptr ? 1 : 0;
  const bool q8 = seg.state_dtype == DType::kQ8 && states > 0;
  float sum = 0.0f;
  WithStorageType(seg.param_dtype, [&](auto pt) HWY_ATTR {
    WithStorageType(seg.grad_dtype, [&](auto gt) HWY_ATTR {
      WithStateCount(states, [&](auto n) HWY_ATTR {
        using P = typename decltype(pt)::type;
        using G = typename decltype(gt)::type;
        constexpr int kStates = decltype(n)::value;
        if constexpr ((kKind == kStep || kKind == kReduce) && kStates > 0) {
          if (q8) {
            sum = TrafficPiece<kKind, G, P, std::uint8_t, kStates, kNt, kPaced>(seg, c, pace, begin,
                                                                                end);
            return;
          }
        }
        sum = TrafficPiece<kKind, G, P, P, kStates, kNt, kPaced>(seg, c, pace, begin, end);
      });
    });
  });
  return sum;
}

// Runs chunks [chunk_begin, chunk_end) of a plan whose scalars are each segment's c, with `pace`
// divisions per vector (a step's regular loop only). kCopy and kFill exist for f32 segments
// without states only (the STREAM-style kernels). Returns the sum of the pace chains (so that the
// caller, behind the dynamic dispatch, keeps them).
float TrafficChunks(const StepPlan<float>& plan, std::size_t chunk_begin, std::size_t chunk_end,
                    int kind, bool stream, int pace) {
  float sum = 0.0f;
  plan.chunks.ForEachPiece(
      chunk_begin, chunk_end, [&](std::size_t i, std::size_t begin, std::size_t end) HWY_ATTR {
        const Segment& seg = plan.chunks.segments()[i];
        const float c = plan.scalars[i];
        if (pace > 0) {
          sum += SegmentTrafficPiece<kStep, false, true>(seg, c, pace, begin, end);
          return;
        }
        WithFlags(
            [&](auto nt) HWY_ATTR {
              constexpr bool kNt = decltype(nt)::value;
              if (kind == kCopy) {
                TrafficPiece<kCopy, float, float, float, 0, kNt>(seg, c, 0, begin, end);
              } else if (kind == kFill) {
                TrafficPiece<kFill, float, float, float, 0, kNt>(seg, c, 0, begin, end);
              } else {
                SegmentTrafficPiece<kStep, kNt>(seg, c, 0, begin, end);
              }
            },
            stream);
      });
  if (stream) hwy::FlushStream();  // non-temporal stores are weakly ordered: done before we return
  return sum;
}

// The reduction pass's traffic over chunks [chunk_begin, chunk_end), with `pace` divisions per
// vector: the step's loads of every piece, nothing stored; returns the sum of the pieces' sums.
float ReduceTrafficChunks(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end,
                          int pace) {
  float total = 0.0f;
  plan.ForEachPiece(
      chunk_begin, chunk_end, [&](std::size_t i, std::size_t begin, std::size_t end) HWY_ATTR {
        const Segment& seg = plan.segments()[i];
        total += pace > 0 ? SegmentTrafficPiece<kReduce, false, true>(seg, 0.0f, pace, begin, end)
                          : SegmentTrafficPiece<kReduce, false>(seg, 0.0f, 0, begin, end);
      });
  return total;
}

// Sum of every gradient element of chunks [chunk_begin, chunk_end) (plus, kPaced, of each vector's
// pace chain): four vector accumulators, so the adds never bound the loop, then 1-lane vectors for
// the tail of each piece.
template <bool kPaced>
float GradReadPieces(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end,
                     int pace) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const hn::CappedTag<float, 1> d1;
  auto acc0 = hn::Zero(d);
  auto acc1 = hn::Zero(d);
  auto acc2 = hn::Zero(d);
  auto acc3 = hn::Zero(d);
  auto acc_tail = hn::Zero(d1);
  plan.ForEachPiece(chunk_begin, chunk_end,
                    [&](std::size_t s, std::size_t begin, std::size_t end) HWY_ATTR {
                      const Segment& seg = plan.segments()[s];
                      WithStorageType(seg.grad_dtype, [&](auto tag) HWY_ATTR {
                        using G = typename decltype(tag)::type;
                        const G* g = static_cast<const G*>(seg.grad);
                        const auto load = [&](auto dv, std::size_t at) HWY_ATTR {
                          const auto v = Io<G>::Load(dv, g + at);
                          if constexpr (kPaced) {
                            return hn::Add(v, PaceChain(v, pace));
                          } else {
                            return v;
                          }
                        };
                        std::size_t i = begin;
                        for (; i + 4 * lanes <= end; i += 4 * lanes) {
                          acc0 = hn::Add(acc0, load(d, i));
                          acc1 = hn::Add(acc1, load(d, i + lanes));
                          acc2 = hn::Add(acc2, load(d, i + 2 * lanes));
                          acc3 = hn::Add(acc3, load(d, i + 3 * lanes));
                        }
                        for (; i < end; ++i) acc_tail = hn::Add(acc_tail, load(d1, i));
                      });
                    });
  const auto sum = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  return hn::GetLane(hn::SumOfLanes(d, sum)) + hn::GetLane(acc_tail);
}

// GradReadPieces with `pace` divisions per vector.
float GradReadChunks(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end,
                     int pace) {
  return pace > 0 ? GradReadPieces<true>(plan, chunk_begin, chunk_end, pace)
                  : GradReadPieces<false>(plan, chunk_begin, chunk_end, 0);
}

}  // namespace fusedopt::baselines::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt::baselines {
HWY_EXPORT(TrafficChunks);
HWY_EXPORT(ReduceTrafficChunks);
HWY_EXPORT(GradReadChunks);

namespace {

constexpr int kStepKind = 0;  // the Kind enum of the per-target code
constexpr int kCopyKind = 1;
constexpr int kFillKind = 2;

void RunTraffic(std::span<const Segment> segments, const Runtime& runtime, int kind,
                TrafficLoop loop, float c) {
  const StepPlan<float> plan{ChunkPlan(segments), std::vector<float>(segments.size(), c)};
  const bool stream = loop.stores == TrafficStores::kStream;
  ParallelForChunks(plan.chunks.num_chunks(), runtime.num_threads(),
                    [&](std::size_t c0, std::size_t c1) {
                      HWY_DYNAMIC_DISPATCH(TrafficChunks)(plan, c0, c1, kind, stream, loop.pace);
                    });
}

// The segments the step and reduction loops exist for (SegmentTrafficPiece): no master; states in
// the param dtype, or 8-bit states with every allocated state's absmax.
void CheckTrafficSegments(std::span<const Segment> segments) {
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    const bool has_states = std::any_of(std::begin(s.state), std::end(s.state),
                                        [](const void* state) { return state != nullptr; });
    const bool q8 = has_states && s.state_dtype == DType::kQ8;
    std::string problem;
    if (s.master != nullptr) {
      problem = "an f32 master";
    } else if (q8) {
      for (int slot = 0; slot < kMaxStates && problem.empty(); ++slot) {
        if (s.state[slot] != nullptr && s.absmax[slot] == nullptr)
          problem = "8-bit state " + std::to_string(slot) + " without absmax";
      }
    } else if (has_states && s.state_dtype != s.param_dtype) {
      problem = "states of dtype " + std::string(DTypeName(s.state_dtype)) + " beside params of " +
                std::string(DTypeName(s.param_dtype));
    }
    if (!problem.empty()) {
      throw std::invalid_argument("same_traffic: segment " + std::to_string(i) + " has " + problem +
                                  "; the traffic loops exist for states in the param dtype or "
                                  "8-bit states with their absmax, without master");
    }
  }
}

Segment F32Array(const float* read, float* write, std::size_t n) {
  Segment s;
  s.param = write;
  s.grad = read;
  s.numel = n;
  return s;
}

}  // namespace

const char* TrafficStoresName(TrafficStores stores) {
  return stores == TrafficStores::kStream ? "stream" : "store";
}

std::string TrafficLoopName(TrafficLoop loop) {
  std::string name = TrafficStoresName(loop.stores);
  if (loop.pace > 0) name += "_pace" + std::to_string(loop.pace);
  return name;
}

void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime, TrafficLoop loop,
                     float c) {
  if (loop.pace < 0 || (loop.pace > 0 && loop.stores != TrafficStores::kRegular)) {
    throw std::invalid_argument("same_traffic: pace " + std::to_string(loop.pace) + " with " +
                                TrafficStoresName(loop.stores) +
                                " stores; a pace is >= 0, and > 0 only with regular stores");
  }
  CheckTrafficSegments(segments);
  RunTraffic(segments, runtime, kStepKind, loop, c);
}

// The sum of chunk(plan, c, c + 1) over all chunks, each computed by the thread that owns it.
template <class Chunk>
float SumOverChunks(std::span<const Segment> segments, const Runtime& runtime, const Chunk& chunk) {
  const ChunkPlan plan(segments);
  std::vector<float> partial(plan.num_chunks(), 0.0f);  // one per chunk, written by its thread
  ParallelForChunks(partial.size(), runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c) partial[c] = chunk(plan, c, c + 1);
  });
  float total = 0.0f;
  for (const float p : partial) total += p;
  return total;
}

float SameTrafficReduce(std::span<const Segment> segments, const Runtime& runtime, int pace) {
  if (pace < 0) throw std::invalid_argument("same_traffic: pace " + std::to_string(pace) + " < 0");
  CheckTrafficSegments(segments);
  return SumOverChunks(segments, runtime,
                       [pace](const ChunkPlan& plan, std::size_t c0, std::size_t c1) {
                         return HWY_DYNAMIC_DISPATCH(ReduceTrafficChunks)(plan, c0, c1, pace);
                       });
}

float SameTrafficGradRead(std::span<const Segment> segments, const Runtime& runtime, int pace) {
  if (pace < 0) throw std::invalid_argument("same_traffic: pace " + std::to_string(pace) + " < 0");
  return SumOverChunks(segments, runtime,
                       [pace](const ChunkPlan& plan, std::size_t c0, std::size_t c1) {
                         return HWY_DYNAMIC_DISPATCH(GradReadChunks)(plan, c0, c1, pace);
                       });
}

double TrafficRead(const float* a, std::size_t n, const Runtime& runtime) {
  const Segment s = F32Array(a, nullptr, n);
  return SameTrafficGradRead({&s, 1}, runtime);
}

void TrafficFill(float* a, std::size_t n, float value, const Runtime& runtime,
                 TrafficStores stores) {
  const Segment s = F32Array(nullptr, a, n);
  RunTraffic({&s, 1}, runtime, kFillKind, {.stores = stores}, value);
}

void TrafficCopy(const float* a, float* b, std::size_t n, const Runtime& runtime,
                 TrafficStores stores) {
  const Segment s = F32Array(a, b, n);
  RunTraffic({&s, 1}, runtime, kCopyKind, {.stores = stores}, 1.0f);
}

StreamBandwidth MeasureStreamBandwidth(std::size_t array_bytes, int rounds,
                                       const Runtime& runtime) {
  if (rounds < 1) throw std::invalid_argument("rounds must be >= 1");
  const std::size_t n = std::max<std::size_t>(array_bytes / sizeof(float), 1);
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  const auto alloc = [&] {
    return std::unique_ptr<float[], Free>(new (std::align_val_t{64}) float[n]);
  };
  const auto a = alloc();
  const auto b = alloc();
  // First touch by the threads that later stream them (pages land near them), untimed.
  TrafficFill(a.get(), n, 1.0f, runtime, TrafficStores::kRegular);
  TrafficFill(b.get(), n, 2.0f, runtime, TrafficStores::kRegular);

  const double bytes = static_cast<double>(n * sizeof(float));
  const auto best_gbps = [&](double moved, const auto& kernel) {
    double best_s = 0.0;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      kernel();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0 || s < best_s) best_s = s;
    }
    return moved / best_s * 1e-9;
  };
  StreamBandwidth result{
      .array_bytes = n * sizeof(float), .threads = runtime.num_threads(), .rounds = rounds};
  volatile double sink = 0.0;  // keeps the sums, so the reads cannot be dropped
  result.read_gb_per_s = best_gbps(bytes, [&] { sink = sink + TrafficRead(a.get(), n, runtime); });
  for (const TrafficStores stores : kAllTrafficStores) {
    const auto k = static_cast<std::size_t>(stores);
    result.write_gb_per_s[k] =
        best_gbps(bytes, [&] { TrafficFill(b.get(), n, 3.0f, runtime, stores); });
    result.copy_gb_per_s[k] =
        best_gbps(2 * bytes, [&] { TrafficCopy(a.get(), b.get(), n, runtime, stores); });
  }
  return result;
}

}  // namespace fusedopt::baselines
#endif
