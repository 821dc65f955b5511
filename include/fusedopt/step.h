// The fused step over raw buffers: one call updates every parameter tensor of a model in one
// multi-threaded, vectorized pass ("multi-tensor apply").
//
// A model's parameters are described by Segments, one per tensor. The engine concatenates their
// element ranges, cuts the total into kGrainElements chunks and hands the chunks to threads
// statically, so 83 small tensors cost the same as one flat buffer and results are identical for
// any thread count.
//
// The core keeps no optimizer objects: the caller owns the buffers and the per-tensor step counters
// (the Optimizer classes in optimizer.h do this for C++ users; the PyTorch adapter keeps them in
// `state`). Scalar coefficients (bias corrections, lr/bc1, ...) are computed in double per tensor
// and rounded to f32 once, as torch.optim does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "fusedopt/dtype.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"

namespace fusedopt {

inline constexpr int kMaxStates = 3;
// Per-tensor scalar states (torch's 0-d state tensors other than 'step': NAdam's mu_product).
inline constexpr int kMaxScalars = 2;

// One parameter tensor. Pointers need no alignment; buffers of different segments must not overlap.
struct Segment {
  void* param = nullptr;
  const void* grad = nullptr;    // read only
  void* state[kMaxStates] = {};  // indexed by <Algo>State (hyper.h); unused entries stay null
  // With state_dtype kQ8: each used state slot's absmax, one f32 per block of kQuantBlock elements
  // (fusedopt/quantize.h), read and rewritten by the step. Null otherwise.
  float* absmax[kMaxStates] = {};
  // Optional f32 master copy of a 16-bit param: the update runs on it and the param receives its
  // rounding.
  float* master = nullptr;
  // The tensor's scalar states, one f32 each, indexed by <Algo>Scalar (hyper.h), for an algorithm
  // that keeps any (NAdam: scalars[0] is mu_product; unused entries stay null; those the algorithm
  // uses must be non-null, even with numel 0). A step reads them to compute its coefficients and
  // writes their new values back only after its update pass ran: a rejected call, or a TrainingStep
  // skipped for Inf/NaN gradients, leaves them bit-identical. Segments of one call must not share
  // them (a param listed twice goes into separate waves, see TrainingStepOptions::wave_ends).
  float* scalars[kMaxScalars] = {};
  std::size_t numel = 0;
  // For an algorithm with per-row reductions (AdamP): the number of channel rows of the param, its
  // size(0) when it has more than one dimension, each row numel / rows elements contiguous in
  // memory (rows must divide numel; the segment is the whole tensor); 0 for a param with at most
  // one dimension. The other algorithms ignore it.
  std::size_t rows = 0;
  // For Adafactor (factored second moments): size(-1) of a param with more than one dimension, and
  // rows its size(-2); the param is numel / (rows·cols) row-major rows × cols matrices (a batch),
  // its state[kAdafactorRowVar] holds batch·rows elements and state[kAdafactorColVar] batch·cols.
  // 0 (with rows 0) for a param of at most one dimension. The other algorithms ignore it.
  std::size_t cols = 0;
  DType param_dtype = DType::kF32;
  DType grad_dtype = DType::kF32;
  // Dtype of all state buffers of this segment. kQ8 (8-bit block-wise codes with absmax) is taken
  // by the element-wise algorithms, neither by the two-phase ones (LAMB, LARS, AdamP, BertAdam)
  // nor by Adafactor's factored states.
  DType state_dtype = DType::kF32;
  std::uint32_t group = 0;  // index into the groups span of the step call
  // The step being taken, counted per tensor as torch's state['step']: 1 on this tensor's first
  // update. Adam/RMSprop/Adagrad use it for bias correction and lr decay; SGD copies the gradient
  // into a fresh momentum buffer when it is 1.
  std::int64_t step = 1;
  // Multiplies the gradient as it is read, before maximize and weight decay: 1/loss_scale to
  // unscale mixed-precision gradients inside the step (no separate pass; the grad buffer is not
  // written). Must be finite; 1 leaves the gradient exactly as it is.
  float grad_scale = 1.0f;
  // Opt-in stochastic rounding (include/fusedopt/rounding.h, docs/numerics.md): when true, stores
  // of a 16-bit param without a master copy (pure bf16/f16 training) and of 16-bit state buffers
  // round stochastically instead of to nearest even. f32 stores, and the 16-bit param copy of an
  // f32 master, stay as they are. Off (the default), results are bit-identical to a build without
  // this feature.
  bool stochastic_rounding = false;
  // Seed of the rounding noise. The noise of an element is RoundingNoise(rounding_seed,
  // NoiseStep(segment), global_offset + i, stream) with one stream per buffer (param,
  // state[0..2]): a pure function of these, never of threads, chunks, SIMD target or how the model
  // is split into segments.
  std::uint64_t rounding_seed = 0;
  // The step that keys the noise, counted per tensor like `step` (1 on its first update), so that
  // an element draws new noise every step; 0 (the default) takes `step`. A front end whose `step`
  // is no count (SGD, Lion, LARS keep none; SGD's 1 only marks a fresh momentum buffer) passes the
  // tensor's own count here, or every step would round with the same noise.
  std::int64_t rounding_step = 0;
  // Index of this tensor's first element in the whole, unsharded parameter vector (the running sum
  // of the numel of the tensors before it), so that noise does not depend on how the model is
  // split into segment lists, calls or ZeRO shards. Only read with stochastic_rounding;
  // global_offset + numel must not exceed 2^64 - 1.
  std::uint64_t global_offset = 0;
};

// The step that keys a segment's rounding noise: rounding_step where set, else step.
inline std::int64_t NoiseStep(const Segment& s) {
  return s.rounding_step != 0 ? s.rounding_step : s.step;
}

// One step function per algorithm, Stem##Step, generated from the list in hyper.h (SgdStep,
// AdamStep, ..., AdafactorStep); what each one runs besides its update pass is said next to its
// Hyper struct there. Each call validates all groups and segments first and throws
// fusedopt::Error (naming the segment or group, the field and its value) without touching any
// buffer; then it updates every segment.
#define FUSEDOPT_DECLARE_STEP_(Stem, Alias)                                               \
  void Stem##Step(std::span<const Stem##Hyper> groups, std::span<const Segment> segments, \
                  Runtime& runtime = DefaultRuntime());
FUSEDOPT_FOR_EACH_ALGORITHM(FUSEDOPT_DECLARE_STEP_)
#undef FUSEDOPT_DECLARE_STEP_

// The same steps chosen by the Hyper type, for generic code: FusedStep(std::span<const
// LionHyper>(...), ...) is LionStep. Defined for every Hyper struct of hyper.h.
template <class Hyper>
void FusedStep(std::span<const Hyper> groups, std::span<const Segment> segments,
               Runtime& runtime = DefaultRuntime());

// Which Segment::state slots a tensor needs under these hyper-parameters: bit i stands for state[i]
// (e.g. 0b111 for Adam with amsgrad, 0b101 for centered RMSprop without momentum). Defined for
// every Hyper struct of hyper.h.
template <class Hyper>
unsigned RequiredStates(const Hyper& h);

}  // namespace fusedopt
