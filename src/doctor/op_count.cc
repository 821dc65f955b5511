// The doctor's op and byte model (doctor.h: CountStandardOps, CountFusedOps, FusedFootprintOf):
// the for-loop step counted by running its descriptor's StandardStep on a symbolic tensor, the
// fused step from its passes.
#include <cstdint>
#include <initializer_list>
#include <set>
#include <vector>

#include "src/algos/registry.h"
#include "src/doctor/checks.h"
#include "src/doctor/doctor.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using baselines::BenchHyper;
using tools::CheckedMul;
using tools::HasReductionPass;
using tools::IsFactored;
using tools::ReducesSegment;
using tools::ReductionReadsOf;
using tools::ShardsWithZeroOne;
using tools::WithDescriptor;

namespace {

// One elementary op of the for-loop step on one tensor: how many tensors of that tensor's size it
// reads (distinct tensors: addcmul_(grad, grad) reads grad once) and writes. A factored step's
// small tensors (a row or column factor: rows + cols values per matrix) count as none.
struct TensorOp {
  int reads;
  int writes;
};

// The doctor's visitor of a descriptor's StandardStep (src/algos/descriptor.h): ForEachTensor runs
// the body once, on one symbolic tensor, and each op records its TensorOp. The tensor is in steady
// state (step 2: SGD's first step only copies the grad into its buffer); norm() returns 0 (the
// sequence does not depend on values). The doctor knows each tensor's numel only: its tensors are
// vectors (matrices() false), as in the fused step it times. Methods carry torch's op names.
// NOLINTBEGIN(readability-identifier-naming)
class OpCounter {
 public:
  struct Tensor {
    int id;
    algos::Shape shape = algos::Shape::kParam;
  };

  template <class F>
  void ForEachTensor(F&& f) {
    f(*this);
  }
  std::int64_t step() const { return 2; }
  Tensor param() const { return {0}; }
  Tensor grad() const { return {1}; }
  Tensor state(int slot) const { return {2 + slot}; }
  Tensor state(int slot, algos::Shape shape) const { return {2 + slot, shape}; }
  bool matrices() const { return false; }
  std::size_t size(int /*dim*/) const { return 1; }

  Tensor mul_(Tensor x, double /*s*/) { return Write(x, {x}); }
  Tensor mul_(Tensor x, Tensor b) { return Write(x, {x, b}); }
  Tensor div_(Tensor x, Tensor b) { return Write(x, {x, b}); }
  Tensor div_(Tensor x, double /*s*/) { return Write(x, {x}); }
  Tensor square_(Tensor x) { return Write(x, {x}); }
  Tensor rsqrt_(Tensor x) { return Write(x, {x}); }
  Tensor add_(Tensor x, double /*s*/) { return Write(x, {x}); }
  Tensor add_(Tensor x, Tensor b, double /*alpha*/) { return Write(x, {x, b}); }
  Tensor lerp_(Tensor x, Tensor b, double /*w*/) { return Write(x, {x, b}); }
  Tensor addcmul_(Tensor x, Tensor b, Tensor c, double /*v*/) { return Write(x, {x, b, c}); }
  Tensor addcdiv_(Tensor x, Tensor b, Tensor c, double /*v*/) { return Write(x, {x, b, c}); }
  Tensor sqrt_(Tensor x) { return Write(x, {x}); }
  Tensor sgn_(Tensor x) { return Write(x, {x}); }
  Tensor copy_(Tensor x, Tensor a) { return Write(x, {a}); }
  Tensor maximum(Tensor a, Tensor b, Tensor out) { return Write(out, {a, b}); }
  Tensor clamp_(Tensor x, double /*lo*/, double /*hi*/) { return Write(x, {x}); }
  Tensor masked_fill_(Tensor x, Tensor c, algos::Compare /*cmp*/, double /*t*/, double /*v*/) {
    return Write(x, {x, c});
  }

  Tensor neg(Tensor a) { return New({a}); }
  Tensor abs(Tensor a) { return New({a}); }
  Tensor reciprocal(Tensor a) { return New({a}); }
  Tensor mul(Tensor a, Tensor b) { return New({a, b}); }
  Tensor clone(Tensor a) { return New({a}); }
  Tensor mul(Tensor a, double /*s*/) { return New({a}); }
  Tensor div(Tensor a, double /*s*/) { return New({a}); }
  Tensor div(Tensor a, Tensor b) { return New({a, b}); }
  Tensor add(Tensor a, double /*s*/) { return New({a}); }
  Tensor add(Tensor a, Tensor b, double /*alpha*/) { return New({a, b}); }
  Tensor sqrt(Tensor a) { return New({a}); }
  Tensor addcmul(Tensor a, Tensor b, Tensor c, double /*v*/) { return New({a, b, c}); }
  Tensor sign(Tensor a) { return New({a}); }
  Tensor norm(Tensor a, int dim) { return New({a}, algos::Reduced(a.shape, dim)); }
  Tensor mean(Tensor a, int dim) { return New({a}, algos::Reduced(a.shape, dim)); }
  Tensor matmul(Tensor a, Tensor b) { return New({a, b}, algos::Shape::kParam); }

  double norm(Tensor a) {
    Record({a}, 0);
    return 0.0;
  }
  // The row ops: one symbolic tensor of one row; the row norms and sums are zeros.
  std::size_t rows() const { return 1; }
  std::size_t numel() const { return 1; }
  std::vector<double> row_norms(Tensor a, std::size_t rows) {
    Record({a}, 0);
    return std::vector<double>(rows, 0.0);
  }
  std::vector<double> row_sums(Tensor a, std::size_t rows) {
    Record({a}, 0);
    return std::vector<double>(rows, 0.0);
  }
  Tensor div_rows(Tensor a, const std::vector<double>& /*values*/) { return New({a}); }
  Tensor mul_rows(Tensor a, const std::vector<double>& /*values*/) { return New({a}); }

  const std::vector<TensorOp>& ops() const { return ops_; }

 private:
  static bool Full(const Tensor& t) { return t.shape == algos::Shape::kParam; }
  void Record(std::initializer_list<Tensor> reads, int writes) {
    std::set<int> distinct;
    for (const Tensor& t : reads) {
      if (Full(t)) distinct.insert(t.id);
    }
    ops_.push_back({static_cast<int>(distinct.size()), writes});
  }
  Tensor Write(Tensor out, std::initializer_list<Tensor> reads) {
    Record(reads, Full(out) ? 1 : 0);
    return out;
  }
  // A new temporary, of the shape of the first tensor read unless given.
  Tensor New(std::initializer_list<Tensor> reads) { return New(reads, reads.begin()->shape); }
  Tensor New(std::initializer_list<Tensor> reads, algos::Shape shape) {
    const Tensor out{next_id_++, shape};
    Record(reads, Full(out) ? 1 : 0);
    return out;
  }

  int next_id_ = 2 + kMaxStates;  // after param, grad and the state slots
  std::vector<TensorOp> ops_;
};
// NOLINTEND(readability-identifier-naming)

// The descriptor's StandardStep (the reference's for-loop step, foreach=False;
// src/baselines/standard.cc times the same sequence), counted. Scalar host work (Adam's step_t +=
// 1, LAMB's clip coefficient and trust ratio) moves no tensor data and is not counted.
std::vector<TensorOp> StandardOpsPerTensor(const Model& m, const DoctorOptions& o) {
  const BenchHyper hyper = MakeHyper(m, o);
  OpCounter counter;
  WithDescriptor(m.algorithm, [&](auto d) {
    using A = typename decltype(d)::type;
    A::StandardStep(hyper.Of<typename A::Hyper>(), hyper.standard, counter);
  });
  return counter.ops();
}

// clip_grad_norm_ (foreach=False, as on the CPU): vector_norm(grad) per tensor (read), the norm of
// the stacked norms (stack + vector_norm: 2 ops on T scalars, bytes neglected), the clamp of the
// clip coefficient (1 op), grad.mul_(clip_coef_clamped) per tensor (read + write).
constexpr std::size_t kClipScalarOps = 3;
constexpr int kClipPassesPerElement = 3;

OpCount MakeCount(std::size_t ops, std::size_t passes_per_element, const Model& m) {
  const std::size_t bytes =
      CheckedMul(CheckedMul(passes_per_element, m.numel, "numels (bytes moved)"),
                 DTypeSize(m.dtype), "numels (bytes moved)");
  return {ops, static_cast<double>(passes_per_element), bytes};
}

}  // namespace

OpCount CountStandardOps(const DoctorOptions& options) {
  const Model m = CheckedModel(options);
  std::size_t ops = 0;
  std::size_t passes = 0;  // per element, over all tensors
  for (const TensorOp& op : StandardOpsPerTensor(m, options)) {
    ops += m.num_tensors;
    passes += static_cast<std::size_t>(op.reads + op.writes);
  }
  if (options.clip) {
    ops += 2 * m.num_tensors + kClipScalarOps;
    passes += kClipPassesPerElement;
  }
  return MakeCount(ops, passes, m);
}

OpCount CountFusedOps(const DoctorOptions& options) {
  const Model m = CheckedModel(options);
  const std::size_t states = FusedStates(m, options);
  // param read + write, grad read, each state read + write; a two-phase step's reduction pass
  // reads what it reads once more (baselines::ReductionTraffic, as `fusedopt bench` counts it;
  // the doctor's tensors are vectors, which AdamP's skips); the pre-pass reads the grads again.
  std::size_t passes = 2 + 1 + 2 * states;
  std::size_t ops = 1;
  if (IsFactored(m.algorithm)) {
    // Adafactor's doctor tensors are vectors (numels only): the stats pass reads the param, the
    // grad and the variance, the update pass reads and writes the param and the variance and
    // reads the grad (FactoredTraffic's bytes).
    passes = 3 + 5;
    ops = 2;
  }
  if (HasReductionPass(m.algorithm) && ReducesSegment(m.algorithm, Segment{})) {
    switch (ReductionReadsOf(m.algorithm)) {
      case algos::ReductionReads::kGrad:
        passes += 1;
        break;
      case algos::ReductionReads::kParamAndGrad:
        passes += 2;
        break;
      case algos::ReductionReads::kAll:
        passes += 2 + states;
        break;
    }
    ops += 1;
  }
  if (options.clip) {
    passes += 1;
    ops += 1;
  }
  return MakeCount(ops, passes, m);
}

FusedFootprint FusedFootprintOf(const DoctorOptions& options) {
  const Model m = CheckedModel(options);
  const std::size_t size = DTypeSize(m.dtype);
  return {.numel = m.numel,
          .param = size,
          .grad = size,
          .state = CheckedMul(FusedStates(m, options), size, "state bytes per element"),
          .shardable = ShardsWithZeroOne(m.algorithm)};
}

}  // namespace fusedopt::doctor
