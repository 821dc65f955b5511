// The one loop skeleton of every kernel, and the switch from runtime dtypes to storage types.
// Per-target header: toggling include guard.

#if defined(FOPT_CPU_LOOP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#  ifdef FOPT_CPU_LOOP_INL_H_
#    undef FOPT_CPU_LOOP_INL_H_
#  else
#    define FOPT_CPU_LOOP_INL_H_
#  endif

#  include <algorithm>
#  include <cstddef>
#  include <cstdint>
#  include <type_traits>
#  include <vector>

#  include "fusedopt/dtype.h"
#  include "hwy/highway.h"
#  include "src/core/plan.h"
#  include "src/cpu/io-inl.h"
#  include "src/cpu/quantize_blocks.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Calls body(d, i) for full f32 vectors over [begin, end), then body(d1, i) with a 1-lane tag for
// the remainder, so the tail runs the very same code. No overlapping last vector: the update is in
// place and not idempotent.
template <class Body>
HWY_INLINE void ForEachVector(std::size_t begin, std::size_t end, const Body& body) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = begin;
  for (; i + lanes <= end; i += lanes) body(d, i);
  const hn::CappedTag<float, 1> d1;
  for (; i < end; ++i) body(d1, i);
}

template <class T>
struct StorageTag {
  using type = T;
};

// Calls f(StorageTag<T>{}) with T the storage type of dtype t.
template <class F>
HWY_INLINE void WithStorageType(DType t, const F& f) {
  switch (t) {
    case DType::kF32:
    case DType::kQ8:  // never a param's or grad's (validated); 8-bit states run as f32 parts
      return f(StorageTag<float>{});
    case DType::kF16:
      return f(StorageTag<hwy::float16_t>{});
    case DType::kBF16:
      return f(StorageTag<hwy::bfloat16_t>{});
  }
}

// Calls f(flag...) with each runtime bool turned into std::true_type / std::false_type, so a
// kernel's mode flags become template arguments: one branch-free loop per combination instead of
// tests in the loop body.
template <class F>
HWY_INLINE void WithFlags(const F& f) {
  f();
}
template <class F, class... Bools>
HWY_INLINE void WithFlags(const F& f, bool first, Bools... rest) {
  const auto bind = [&](auto flag) HWY_ATTR {
    WithFlags([&](auto... flags) HWY_ATTR { f(flag, flags...); }, rest...);
  };
  if (first) {
    bind(std::true_type{});
  } else {
    bind(std::false_type{});
  }
}

// True when a segment asks for stochastic rounding and has a store it applies to: a 16-bit param
// without master copy, or 16-bit states.
inline bool RoundsStochastically(const Segment& seg) {
  return seg.stochastic_rounding && ((seg.param_dtype != DType::kF32 && seg.master == nullptr) ||
                                     seg.state_dtype != DType::kF32);
}

// Calls f(StorageTag<Buffers>{}) with Buffers the SegmentBuffers type that runs segment `seg`. The
// dtype combinations training uses get loops with their storage types compiled in: the grad of the
// param's dtype (as torch's grads are) with f32 or bf16 states, to nearest even (6 loops), and
// stochastically rounded for bf16 params, bf16 states or both (3). Every other combination (a grad
// of another dtype, f16 states, f16 params rounded stochastically) runs one of two loops whose
// buffers have run-time dtypes (AnyStorage), to nearest even or stochastically: 11 loops per
// kernel, mode and target where one per combination would be 35 (27 + 8). The scalar target (x86
// CPUs without AVX2), there for correctness rather than speed, has only the two run-time loops.
template <class F>
HWY_INLINE void WithSegmentBuffers(const Segment& seg, const F& f) {
  const bool stochastic = RoundsStochastically(seg);
  if constexpr (HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128) {
    const DType p = seg.param_dtype;
    const DType s = seg.state_dtype;
    if (seg.grad_dtype == p && s != DType::kF16) {
      const bool bf16_state = s == DType::kBF16;
      if (!stochastic) {
        return WithStorageType(p, [&](auto param) HWY_ATTR {
          using P = typename decltype(param)::type;
          if (bf16_state) return f(StorageTag<SegmentBuffers<P, P, hwy::bfloat16_t>>{});
          f(StorageTag<SegmentBuffers<P, P, float>>{});
        });
      }
      using BF16 = hwy::bfloat16_t;
      if (p == DType::kBF16) {
        if (bf16_state) return f(StorageTag<SegmentBuffers<BF16, BF16, BF16, true>>{});
        return f(StorageTag<SegmentBuffers<BF16, BF16, float, true>>{});
      }
      if (p == DType::kF32) return f(StorageTag<SegmentBuffers<float, float, BF16, true>>{});
    }
  }
  if (stochastic) return f(StorageTag<SegmentBuffers<AnyStorage, AnyStorage, AnyStorage, true>>{});
  f(StorageTag<SegmentBuffers<AnyStorage, AnyStorage, AnyStorage>>{});
}

// Runs one piece of a segment with one storage-type combination, as a function of its own into
// which the whole loop nest (kernel, mode flags, ForEachVector, loop body) is flattened. Left to
// its heuristics, GCC stops inlining once a function grows past its limits: with all combinations
// and modes inlined into one function per target, loop bodies were left as calls per vector.
//
// Only optimized builds flatten: in the sanitizer (Debug) build it multiplies compile time (tens of
// minutes per algorithm) for no use.
#  if defined(NDEBUG)
#    define FOPT_FLATTEN HWY_FLATTEN
#  else
#    define FOPT_FLATTEN
#  endif
template <class Buffers, class Scalars, class Kernel>
HWY_NOINLINE FOPT_FLATTEN void RunPiece(const Kernel& kernel, const Segment& seg,
                                        const Scalars& scalars, std::size_t begin,
                                        std::size_t end) {
  kernel(Buffers(seg, begin), scalars, begin, end);
}

// Runs a piece with the buffer types WithSegmentBuffers picks for its segment.
template <class Scalars, class Kernel>
HWY_INLINE void RunTypedPiece(const Kernel& kernel, const Segment& seg, const Scalars& scalars,
                              std::size_t begin, std::size_t end) {
  WithSegmentBuffers(seg, [&](auto buffers) HWY_ATTR {
    RunPiece<typename decltype(buffers)::type>(kernel, seg, scalars, begin, end);
  });
}

// The part [begin, begin + n) of a segment as a segment of its own, its states in `states` (f32,
// by slot): the kernel runs on it unchanged, with the f32-state loops it has anyway. Noise keys
// stay those of the whole segment (global_offset moves with the part).
inline Segment PartWithF32States(const Segment& seg, std::size_t begin, std::size_t n,
                                 float* const* states) {
  Segment part = seg;
  part.param = static_cast<char*>(seg.param) + begin * DTypeSize(seg.param_dtype);
  part.grad = static_cast<const char*>(seg.grad) + begin * DTypeSize(seg.grad_dtype);
  if (seg.master != nullptr) part.master = seg.master + begin;
  for (int slot = 0; slot < kMaxStates; ++slot) {
    part.state[slot] = seg.state[slot] != nullptr ? states[slot] : nullptr;
  }
  part.numel = n;
  part.state_dtype = DType::kF32;
  part.global_offset = seg.global_offset + begin;
  return part;
}

// The first block edge at or after segment index i.
inline std::size_t RoundUpToBlock(std::size_t i) { return NumQuantBlocks(i) * kQuantBlock; }

// A piece of a segment with 8-bit states (fusedopt/quantize.h), block by block: each block's
// states dequantized into f32 on the stack, updated by the kernel, quantized back with their new
// absmax (all states of the block in one call: their searches interleave), all while the block is
// in L1. A block belongs to the piece that holds its first element, which runs it whole even where
// it reaches into the next chunk: the chunk edges stay those of every other segment, and no block
// is split between threads.
template <class Scalars, class Kernel>
HWY_INLINE void RunQuantizedPiece(const Kernel& kernel, const Segment& seg, const Scalars& scalars,
                                  unsigned unsigned_map_states, std::size_t begin,
                                  std::size_t end) {
  HWY_ALIGN float states[kMaxStates][kQuantBlock];
  float* const parts[kMaxStates] = {states[0], states[1], states[2]};
  static_assert(kMaxStates == 3);
  // The segment's states, each with its map and its f32 block (codes and absmax: per block).
  StateBlock blocks[kMaxStates];
  int slots[kMaxStates];
  std::size_t used = 0;
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if (seg.state[slot] == nullptr) continue;
    slots[used] = slot;
    blocks[used++] = {&QuantTablesOf(SlotMap(unsigned_map_states, slot)), states[slot], nullptr,
                      nullptr};
  }
  const std::size_t last = std::min(RoundUpToBlock(end), seg.numel);
  for (std::size_t b = RoundUpToBlock(begin); b < last; b += kQuantBlock) {
    const std::size_t n = std::min(kQuantBlock, seg.numel - b);
    for (std::size_t k = 0; k < used; ++k) {
      StateBlock& block = blocks[k];
      block.codes = static_cast<std::uint8_t*>(seg.state[slots[k]]) + b;
      block.absmax = &seg.absmax[slots[k]][b / kQuantBlock];
      DequantizeStateBlock(*block.t, block.codes, *block.absmax, n, states[slots[k]]);
    }
    const Segment part = PartWithF32States(seg, b, n, parts);
    RunTypedPiece(kernel, part, scalars, 0, n);
    QuantizeStateBlocks(blocks, used, n);
  }
}

// The reduction pass of a two-phase algorithm over one chunk: kernel(buffers, scalars, begin, end)
// once per piece, as RunPlanChunks calls it, storing nothing. For a segment with 8-bit states the
// kernel runs on a part holding every block the piece touches, the blocks' states decoded into f32
// where the kernel reads them (`reads_states`: LAMB's u), over the piece's own elements: the
// update pass decodes the same values, and the sums are those of the f32 step on the decoded
// states, bit for bit (a block cut by a chunk edge is decoded by both pieces).
template <class Scalars, class Kernel>
HWY_INLINE void ReducePlanChunk(const StepPlan<Scalars>& plan, std::size_t chunk, bool reads_states,
                                const Kernel& kernel) {
  plan.chunks.ForEachPiece(
      chunk, chunk + 1, [&](std::size_t i, std::size_t begin, std::size_t end) HWY_ATTR {
        const Segment& seg = plan.chunks.segments()[i];
        if (seg.state_dtype != DType::kQ8) {
          return RunTypedPiece(kernel, seg, plan.scalars[i], begin, end);
        }
        const std::size_t first = begin / kQuantBlock * kQuantBlock;
        const std::size_t n = std::min(RoundUpToBlock(end), seg.numel) - first;
        float* parts[kMaxStates] = {};
        thread_local std::vector<float> decoded;  // the piece's states, slot after slot
        if (reads_states) {
          decoded.resize(kMaxStates * n);
          for (int slot = 0; slot < kMaxStates; ++slot) {
            if (seg.state[slot] == nullptr) continue;
            parts[slot] = decoded.data() + static_cast<std::size_t>(slot) * n;
            const QuantTables& t = QuantTablesOf(SlotMap(plan.unsigned_map_states, slot));
            for (std::size_t b = 0; b < n; b += kQuantBlock) {
              DequantizeStateBlock(t, static_cast<const std::uint8_t*>(seg.state[slot]) + first + b,
                                   seg.absmax[slot][(first + b) / kQuantBlock],
                                   std::min(kQuantBlock, n - b), parts[slot] + b);
            }
          }
        }
        RunTypedPiece(kernel, PartWithF32States(seg, first, n, parts), plan.scalars[i],
                      begin - first, end - first);
      });
}

// Runs kernel(SegmentBuffers<...>, scalars, begin, end) on every piece of chunks
// [chunk_begin, chunk_end) of a plan, with the buffer types WithSegmentBuffers picks for its
// segment.
template <class Scalars, class Kernel>
HWY_INLINE void RunPlanChunks(const StepPlan<Scalars>& plan, std::size_t chunk_begin,
                              std::size_t chunk_end, const Kernel& kernel) {
  plan.chunks.ForEachPiece(
      chunk_begin, chunk_end, [&](std::size_t i, std::size_t begin, std::size_t end) HWY_ATTR {
        const Segment& seg = plan.chunks.segments()[i];
        if (seg.state_dtype == DType::kQ8) {
          RunQuantizedPiece(kernel, seg, plan.scalars[i], plan.unsigned_map_states, begin, end);
        } else {
          RunTypedPiece(kernel, seg, plan.scalars[i], begin, end);
        }
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_LOOP_INL_H_
