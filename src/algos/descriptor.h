// What every algorithm descriptor (src/algos/<algo>.h) is made of. A descriptor is a struct with
// static members only, the one place that says, for its algorithm:
//
//   Hyper, Scalars      the public hyper-parameter struct (fusedopt/hyper.h) and the per-tensor f32
//                       coefficients its math body reads (src/math/scalars.h)
//   kName, kStepName    "lion" (CLI, Python) and "LionStep" (error messages)
//   kStates             torch's state_dict key of each Segment::state slot
//   kUnsignedMapStates  optional bit set: the state slots whose 8-bit codes use the unsigned map
//                       (fusedopt/quantize.h; non-negative states); the others use the signed one.
//                       bitsandbytes' twins decide where they exist (Adam: exp_avg_sq; RMSprop's
//                       and Adagrad's non-negative states stay signed there)
//   kCountsSteps        optional, false where torch's state has no "step" (CountsSteps<A>())
//   CountsBufferSteps(h)  optional: Segment::step counts the momentum buffer's steps (below)
//   kTorchName          "RMSprop": the class name its reference gives it (torch.optim's, apex's
//                       LAMB, lion-pytorch's Lion; tests/golden/<lowercase>.json, fusedopt::pt::)
//   kFields             every Hyper field: its name and torch's param_group key (Field, below:
//                       the one group-key mapping)
//   BenchHyper()        optional: the hyper-parameters `fusedopt bench` and the doctor time, where
//                       the Hyper's defaults would leave typical work out (SGD's momentum buffer)
//   RequiredStates(h)   which state slots the hyper-parameters need (bit i: state[i])
//   InitialState(h, k)  the value a fresh state slot k starts from
//   Validate(check, h)  the rules of the hyper-parameters
//   MakeScalars(h, s)   the coefficients of one tensor, computed in double and rounded once
//   kRun                the kernel (src/core/kernels.h), which runs src/math/<algo>_math.h
//   StandardStep(h, o, step)  the reference's for-loop step (torch.optim's _single_tensor_<algo>,
//                       lion-pytorch, tools/lamb_reference.py) as elementary tensor ops, one per
//                       line, with the reference's temporaries (the op vocabulary is below)
// and, for an algorithm with per-tensor scalar states (Segment::scalars: 0-d state tensors such as
// NAdam's mu_product):
//   kScalarStates       torch's state_dict key of each Segment::scalars entry
//   InitialScalar(h, k) the value a fresh scalar state k starts from
//   NextScalars(h, s, next)  the values this step leaves in s.scalars, from the old ones there and
//                       s.step (f32, rounded as the reference rounds its 0-d tensor)
//   MakeScalars(h, s, next)  takes them too (s.scalars still holds the old values)
// The step validates s.scalars non-null for every segment (numel 0 too: torch advances the scalars
// of an empty param), computes every `next` before the update pass and stores them into
// s.scalars after it, so a rejected or skipped step leaves them as they were.
// And, for a two-phase algorithm (a per-tensor reduction before the update, e.g. LAMB's norms):
//   kReductions         how many sums the reduction pass gives per tensor
//   kReduce             the reduction kernel
//   Finish(h, s, sums, scalars)  turns a tensor's sums into its update coefficients
// and, for a two-phase algorithm whose coefficients come from the sums of several tensors together
// (BertAdam: one gradient norm per (group, param dtype)), instead of Finish:
//   FinishAll(groups, segments, sums, scalars)  with every segment's kReductions sums, in
//                       segment order, and every segment's coefficients
// and optionally kReductionReads (ReductionReads, below; kAll where absent): what kReduce reads,
// and ReducesSegment(s): false for a segment kReduce skips (AdamP: a param of at most one
// dimension), the traffic floor `fusedopt bench` and the doctor count for the reduction pass; and
// NeedsReduction(h): false for a group whose coefficients do not read the sums (the step skips the
// pass when no group does; FinishAll is then not called and MakeScalars' values stand).
// and, for a two-phase algorithm whose sums are per channel row (AdamP: of a param's view(size(0),
// -1), Segment::rows rows of numel / rows elements; a segment with rows 0 is one row):
//   kRowValues          how many floats per row Finish writes for the update pass
//   kReduce             then writes kReductions sums for each row part of each piece (the piece's
//                       rows in order, the first and last possibly partial)
//   Finish(h, s, sums, scalars, row_values)  with the tensor's sums row by row (max(rows, 1) ×
//                       kReductions, each row's parts added in chunk order) and its rows ×
//                       kRowValues floats, which live until the update pass has run
//
// and, for a factored algorithm (Adafactor: state buffers not shaped like the param; a param of
// more than one dimension is Segment::rows × Segment::cols matrices), instead of the chunk passes:
//   kFactored           true; the step is RunFactoredStep (src/core/factored_step.h) over tiles
//                       (src/core/tiles.h), each pass a call of kRunTiles
//   SegmentStates(s)    which state slots a segment needs (by its shape; RequiredStates(h) says
//                       which ones any segment may need)
//   Alpha, Factors, NegAlpha  the host work between the passes (see src/algos/adafactor.h)
//   kRowFactorSlot, kColFactorSlot  the state slots of a matrix's row and column factors
//   kStateShapes        the Shape (below) of each state slot's tensor in StandardStep: row_var
//                       kRows, col_var kCols, variance kParam
//
// src/algos/registry.h lists the descriptors; the step functions, Optimizer<>, the Python module
// and the tools loop over that list.
//
// StandardStep is a template over its visitor `step`, so one op sequence serves two readers: the
// `standard` baseline (src/baselines/standard.cc) runs every op as one full pass over memory, and
// the doctor (src/doctor/op_count.cc) counts the tensors each op reads and writes. It calls
// step.ForEachTensor(f), and f(t) issues one tensor's ops on t. A handle (`auto`) names the
// tensor's param(), grad() or state(slot), or a temporary of the param's shape and dtype that an
// out-of-place op returns; a temporary is freed with its last handle, as Python frees it.
// Scalars are doubles, rounded to f32 once where a Python float meets an f32 tensor.
//   t.step()                   the tensor's step counter (1 on its first update)
//   in place, return x:        mul_(x, s)  mul_(x, b)  div_(x, b)  add_(x, s)  add_(x, b, alpha)
//                              lerp_(x, b, w)  addcmul_(x, b, c, value)  addcdiv_(x, b, c, value)
//                              sqrt_(x)  sgn_(x)  copy_(x, a)  maximum(a, b, /*out=*/x)
//                              clamp_(x, lo, hi)
//                              masked_fill_(x, c, Compare::kGt, t, v): x[c.gt(t)] = v (kLt, kEq
//                              likewise); torch's bool mask and its fill, one pass over x and c
//   a new temporary:           neg(a)  abs(a)  reciprocal(a)  clone(a)  mul(a, s)  mul(a, b)
//                              div(a, s)  div(a, b)  add(a, s)  add(a, b, alpha)  sqrt(a)
//                              addcmul(a, b, c, value)  sign(a)
//   a scalar:                  norm(a) (torch.linalg.vector_norm: reads a, writes nothing)
// The sequence may depend on the hyper-parameters, the options and t.step(), but not on the values
// of the tensors: the doctor counts it without any. For a reference that branches on per-row
// reductions (AdamP), the row ops (their sizes from t.rows() and t.numel()):
//   t.rows(), t.numel()        Segment::rows (the doctor: 1) and the element count
//   per row, on the host:      row_norms(a, rows)  row_sums(a, rows) (std::vector<double>; read a)
//   a new temporary:           div_rows(a, values)  mul_rows(a, values) (a / or · values[row])
// where the doctor's row norms and sums are zeros.
// For a factored reference (Adafactor: states and temporaries of a param's last two dimensions
// reduced to 1, as keepdim=True leaves them), a handle has a Shape: kParam, kRows (dim -1 reduced:
// one value per row, [..., rows, 1]), kCols (dim -2 reduced: [..., 1, cols]) or kMatrices (both:
// one per matrix, [..., 1, 1]); every op above takes handles of one shape, except where said:
//   t.matrices()               whether the param has more than one dimension (grad.dim() > 1): a
//                              batch of size(-2) × size(-1) matrices (Segment::rows, cols; the
//                              doctor's flat tensors: false)
//   t.size(dim)                size(-1) or size(-2) of such a param
//   t.state(slot, shape)       a state slot's tensor of that shape (kStateShapes[slot])
//   in place, return x:        square_(x)  rsqrt_(x) (1 / sqrt, as ATen's)  div_(x, s)
//                              div_(x, b): b of x's shape or one that broadcasts to it (fewer
//                              dims kept: kMatrices over kParam)
//   a new temporary:           norm(a, dim) (torch.norm(a, dim=dim, keepdim=True), dim -1 or -2:
//                              the shape with that dim reduced)  mean(a, dim) (a.mean(dim,
//                              keepdim=True))  matmul(a, b) (a kRows @ b kCols: the outer product
//                              of each matrix's K = 1 factors, of the param's shape)
// A reduction reads its input once and writes the small result; matmul writes a param-sized
// tensor from two small ones.
#pragma once

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <tuple>

#include "fusedopt/step.h"
#include "src/core/step_traits.h"
#include "src/core/validate.h"
#include "src/math/scalars.h"

namespace fusedopt::algos {

// torch's state_dict key of each Segment::state slot ("" for an unused slot).
using StateNames = std::array<const char*, kMaxStates>;

class HyperCheck {
 public:
  HyperCheck(std::string_view fn, std::size_t group) : fn_(fn), group_(group) {}

  // `!(x >= lo)` also rejects NaN.
  void AtLeast(const char* name, double value, double lo) const {
    if (!(value >= lo))
      Fail(fn_, "group ", group_, ": invalid ", name, ": ", value, " (must be >= ", lo, ")");
  }
  // A decay rate of a running average: [0, 1), or [0, 1] when `one_allowed`.
  void Beta(const char* name, double value, bool one_allowed = false) const {
    if (!(value >= 0.0 && (value < 1.0 || (one_allowed && value == 1.0)))) {
      Fail(fn_, "group ", group_, ": invalid ", name, ": ", value,
           one_allowed ? " (must be in [0, 1])" : " (must be in [0, 1))");
    }
  }
  void Finite(const char* name, double value) const {
    if (!std::isfinite(value)) Fail(fn_, "group ", group_, ": invalid ", name, ": ", value);
  }
  template <class... Args>
  [[noreturn]] void Reject(const Args&... args) const {
    Fail(fn_, "group ", group_, ": ", args...);
  }

 private:
  std::string_view fn_;
  std::size_t group_;
};

// The comparison of a masked fill in StandardStep (x[c.gt(t)] = v, c.lt, c.eq).
enum class Compare { kGt, kLt, kEq };

// The shape of a handle of a factored StandardStep (see the vocabulary above): which of the
// param's last two dimensions are reduced to size 1 (bit 0: dim -1, bit 1: dim -2).
enum class Shape : unsigned { kParam = 0, kRows = 1, kCols = 2, kMatrices = 3 };

// The shape `a` leaves after a keepdim reduction over dim (-1 or -2).
constexpr Shape Reduced(Shape a, int dim) {
  return static_cast<Shape>(static_cast<unsigned>(a) | (dim == -1 ? 1u : 2u));
}

// What a reference's for-loop step takes beyond the hyper-parameters of the fused step.
struct StandardOptions {
  // LAMB: the global gradient clipping inside tools/lamb_reference.py's step() (apex FusedLAMB's
  // max_grad_norm, default 1). fusedopt clips in its training step instead (ClipRule::kLamb).
  double max_grad_norm = 1.0;
};

// TwoPhase, FinishesAll, RowReductions, Factored, HasScalarStates, NumScalarStates: in
// src/core/step_traits.h, which the engine's step templates read.

// What a two-phase algorithm's reduction pass reads (descriptor kReductionReads): the gradient, the
// param and every allocated state (LAMB's and AdamP's update before its norm), the param and the
// gradient (LARS's norms), or the gradient only (BertAdam's gradient norm).
enum class ReductionReads { kAll, kParamAndGrad, kGrad };

// Whether torch's state of A keeps a per-param step count ("step"): all but SGD, Lion and LARS,
// whose descriptors say kCountsSteps = false (their updates read only whether a momentum buffer is
// new). Checkpoints save and restore the count where it exists.
template <class A>
constexpr bool CountsSteps() {
  if constexpr (requires { A::kCountsSteps; }) {
    return A::kCountsSteps;
  } else {
    return true;
  }
}

// An algorithm whose momentum buffer starts as a copy of the gradient on the buffer's own first
// step (SGD, LARS: torch's `momentum_buffer is None`), also when momentum is switched on later:
// where its CountsBufferSteps(h) holds, Segment::step counts the steps the tensor's buffer has
// existed, not the tensor's, and the stateful layers keep that count beside the step count.
template <class A>
concept HasBufferSteps = requires(const typename A::Hyper& h) {
  { A::CountsBufferSteps(h) } -> std::convertible_to<bool>;
};
template <class A>
bool CountsBufferSteps(const typename A::Hyper& h) {
  if constexpr (HasBufferSteps<A>) {
    return A::CountsBufferSteps(h);
  } else {
    return false;
  }
}

// A field of a Hyper struct and where torch keeps it: THE one mapping between the Hyper fields and
// torch's param_group keys (checkpoints, the Python classes, the libtorch adapter and the golden
// tests read it; none keeps a table of its own). Spelled in a descriptor's kFields as
//   Field{"lr", &Hyper::lr}                     group["lr"]: the key is the field's name
//   Field{"beta2", &Hyper::beta2, "betas", 1}   group["betas"][1]: a part of a tuple-valued key
//   Field{"maximize", &Hyper::maximize}.Optional()
//                                               the reference's groups may lack the key (a
//                                               fusedopt extension, or a key a later torch added):
//                                               absent, the Hyper's default stands
//   Field{"eps1", &Hyper::eps1, "eps", 0}.Nullable()
//                                               the group may hold None, torch's "the dtype's
//                                               default" (Adafactor's eps1: finfo(dtype).eps; the
//                                               Hyper's default is float32's)
//   Field{"schedule", &Hyper::schedule}.Choices(kNames)
//                                               an int the group holds by name: kNames[value]
// A field in every group of the reference, under its own name, needs none of these.
template <class Hyper, class T>
struct Field {
  const char* name;           // the Hyper member's name (C++, the Python keyword, the CLI)
  T Hyper::*member;           // h.*member
  const char* key = nullptr;  // torch's param_group key; nullptr: `name`
  int index = -1;             // the part of a tuple-valued key (betas[1]: 1); -1: the whole value
  bool optional = false;      // the reference's groups may lack the key
  bool nullable = false;      // the group may hold None: the Hyper's default
  std::span<const std::string_view> choices = {};  // an int held by name: choices[value]

  // torch's param_group key (betas for beta1).
  constexpr std::string_view GroupKey() const { return key != nullptr ? key : name; }
  constexpr bool InTuple() const { return index >= 0; }
  constexpr Field Optional() const {
    Field f = *this;
    f.optional = true;
    return f;
  }
  constexpr Field Nullable() const {
    Field f = *this;
    f.nullable = true;
    return f;
  }
  constexpr Field Choices(std::span<const std::string_view> names) const {
    Field f = *this;
    f.choices = names;
    return f;
  }
  // The value of an enumerated field's name, or -1 (choices only).
  constexpr int ChoiceCode(std::string_view choice) const {
    for (std::size_t i = 0; i < choices.size(); ++i) {
      if (choices[i] == choice) return static_cast<int>(i);
    }
    return -1;
  }
};
template <class Hyper, class T>
Field(const char*, T Hyper::*) -> Field<Hyper, T>;
template <class Hyper, class T>
Field(const char*, T Hyper::*, const char*, int) -> Field<Hyper, T>;
template <class... F>
constexpr auto Fields(F... fields) {
  return std::tuple<F...>(fields...);
}
// f(field) for each of descriptor A's kFields, in order.
template <class A, class F>
constexpr void ForEachField(F&& f) {
  std::apply([&](const auto&... field) { (f(field), ...); }, A::kFields);
}

// fl(g·scale) then negation is exact, so folding the sign into the multiplier changes nothing.
inline float GradMul(bool maximize, float grad_scale) {
  return maximize ? -grad_scale : grad_scale;
}

// torch's lerp_(end, w) receives w as a double and evaluates in f32 (see LerpCoef).
inline LerpCoef MakeLerp(double w) {
  const auto wf = static_cast<float>(w);
  return {wf, wf - 1.0f, !(std::abs(wf) < 0.5f)};
}

}  // namespace fusedopt::algos
