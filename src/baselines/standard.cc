#include "src/baselines/standard.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/quantize.h"
#include "src/baselines/elementwise.h"
#include "src/core/parallel.h"

namespace fusedopt::baselines {

using tools::WithDescriptor;

namespace {

// The row ops of a per-row reference (AdamP's cosine similarity and projection over a param's
// view(rows, -1)), as ATen runs a reduction or broadcast over dim 1: one pass, parallel over rows
// above ATen's grain. Per row f(row, begin, end) over the element range of that row.
template <class F>
void ForEachRow(std::size_t numel, std::size_t rows, const Runtime& runtime, const F& f) {
  const std::size_t length = numel / rows;
  const auto run = [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r) f(r, r * length, (r + 1) * length);
  };
  if (numel <= kGrainElements) {
    run(0, rows);
  } else {
    ParallelForChunks(rows, runtime.num_threads(), run);
  }
}

// Σx² (squares) or Σx of each row, accumulated in double in 8 interleaved sums (ATen sums f32 in
// f32, in vectorized cascades; the traffic is the same, one read). f32 rows are read directly, so
// the compiler vectorizes the 8 sums; 16-bit ones through LoadAsF32.
double RangeSum(TensorRef a, std::size_t begin, std::size_t end, bool squares) {
  constexpr std::size_t kWays = 8;
  double acc[kWays] = {};
  const auto add = [&](std::size_t j, double x) { acc[j] += squares ? x * x : x; };
  std::size_t i = begin;
  if (a.dtype == DType::kF32) {
    const float* x = static_cast<const float*>(a.data);
    for (; i + kWays <= end; i += kWays) {
      for (std::size_t j = 0; j < kWays; ++j) add(j, x[i + j]);
    }
  }
  for (; i < end; ++i) add(0, LoadAsF32(a.data, a.dtype, i));
  double sum = 0.0;
  for (const double x : acc) sum += x;
  return sum;
}
std::vector<double> RowReduce(TensorRef a, std::size_t rows, bool squares, const Runtime& runtime) {
  std::vector<double> out(rows, 0.0);
  ForEachRow(a.numel, rows, runtime, [&](std::size_t r, std::size_t begin, std::size_t end) {
    out[r] = RangeSum(a, begin, end, squares);
  });
  return out;
}

// The sizes of a factored handle (descriptor.h's Shape): a batch of rows × cols matrices, a reduced
// dimension of size 1.
struct Dims {
  std::size_t batch, rows, cols;
  std::size_t numel() const { return batch * rows * cols; }
};
Dims DimsOf(const Segment& s, algos::Shape shape) {
  const auto bits = static_cast<unsigned>(shape);
  if (s.cols == 0 || s.rows == 0) return {1, 1, s.numel};  // a vector: kParam only
  return {s.numel / (s.rows * s.cols), (bits & 2u) != 0 ? 1 : s.rows,
          (bits & 1u) != 0 ? 1 : s.cols};
}

// Runs f(begin, end) over [0, n) items of `per_item` elements each: one call below ATen's grain,
// else split over the threads.
template <class F>
void ForItems(std::size_t n, std::size_t per_item, const Runtime& runtime, const F& f) {
  if (n * per_item <= kGrainElements) {
    f(std::size_t{0}, n);
  } else {
    ParallelForChunks(n, runtime.num_threads(), f);
  }
}

// A keepdim reduction over dim -1 or -2 of `a` (dims `in`) into `out` (its dims with that one 1):
// out[j] = finish(Σ of the reduced elements, or of their squares), the sums in double, each in the
// order of its elements. One read of a, one write of out, as ATen's reduction.
template <class Finish>
void ReduceDim(TensorRef out, TensorRef a, Dims in, int dim, bool squares, const Finish& finish,
               const Runtime& runtime) {
  if (dim == -1) {
    ForItems(in.batch * in.rows, in.cols, runtime, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        StoreFromF32(out.data, out.dtype, r,
                     finish(RangeSum(a, r * in.cols, (r + 1) * in.cols, squares)));
      }
    });
    return;
  }
  // dim -2: column sums of each matrix, a block of columns at a time (one pass down its rows).
  constexpr std::size_t kBlock = 512;
  const std::size_t blocks = (in.cols + kBlock - 1) / kBlock;
  ForItems(in.batch * blocks, std::min(in.cols, kBlock) * in.rows, runtime,
           [&](std::size_t k0, std::size_t k1) {
             double acc[kBlock];
             for (std::size_t k = k0; k < k1; ++k) {
               const std::size_t b = k / blocks;
               const std::size_t c0 = k % blocks * kBlock;
               const std::size_t width = std::min(in.cols, c0 + kBlock) - c0;
               std::fill_n(acc, width, 0.0);
               for (std::size_t r = 0; r < in.rows; ++r) {
                 const std::size_t row = (b * in.rows + r) * in.cols + c0;
                 if (a.dtype == DType::kF32) {
                   const float* x = static_cast<const float*>(a.data) + row;
                   for (std::size_t c = 0; c < width; ++c) {
                     const double v = x[c];
                     acc[c] += squares ? v * v : v;
                   }
                 } else {
                   for (std::size_t c = 0; c < width; ++c) {
                     const double v = LoadAsF32(a.data, a.dtype, row + c);
                     acc[c] += squares ? v * v : v;
                   }
                 }
               }
               for (std::size_t c = 0; c < width; ++c) {
                 StoreFromF32(out.data, out.dtype, b * in.cols + c0 + c, finish(acc[c]));
               }
             }
           });
}

// out = a · b or a / b (f32, rounded to out's dtype), a and b broadcast to out's dims (a reduced
// dimension repeats its one value): one pass over out, parallel over its rows above the grain.
void Broadcast(bool divide, TensorRef out, Dims od, TensorRef a, Dims ad, TensorRef b, Dims bd,
               const Runtime& runtime) {
  // element (m, r, c) of x with dims xd, as an index and its step along c
  const auto at = [](const Dims& xd, std::size_t m, std::size_t r) {
    return m * xd.rows * xd.cols + (xd.rows == 1 ? 0 : r) * xd.cols;
  };
  const bool f32 = out.dtype == DType::kF32 && a.dtype == DType::kF32 && b.dtype == DType::kF32;
  ForItems(od.batch * od.rows, od.cols, runtime, [&](std::size_t r0, std::size_t r1) {
    for (std::size_t row = r0; row < r1; ++row) {
      const std::size_t m = row / od.rows;
      const std::size_t r = row % od.rows;
      const std::size_t o0 = row * od.cols;
      const std::size_t a0 = at(ad, m, r);
      const std::size_t b0 = at(bd, m, r);
      const std::size_t sa = ad.cols == 1 ? 0 : 1;
      const std::size_t sb = bd.cols == 1 ? 0 : 1;
      if (f32) {  // vectorized: the strides are 0 or 1
        float* y = static_cast<float*>(out.data) + o0;
        const float* x = static_cast<const float*>(a.data) + a0;
        const float* z = static_cast<const float*>(b.data) + b0;
        const auto loop = [&](auto op) {
          if (sa == 0 && sb == 1) {
            for (std::size_t c = 0; c < od.cols; ++c) y[c] = op(x[0], z[c]);
          } else if (sa == 1 && sb == 0) {
            for (std::size_t c = 0; c < od.cols; ++c) y[c] = op(x[c], z[0]);
          } else {
            for (std::size_t c = 0; c < od.cols; ++c) y[c] = op(x[c * sa], z[c * sb]);
          }
        };
        if (divide) {
          loop([](float u, float v) { return u / v; });
        } else {
          loop([](float u, float v) { return u * v; });
        }
        continue;
      }
      for (std::size_t c = 0; c < od.cols; ++c) {
        const float u = LoadAsF32(a.data, a.dtype, a0 + c * sa);
        const float v = LoadAsF32(b.data, b.dtype, b0 + c * sb);
        StoreFromF32(out.data, out.dtype, o0 + c, divide ? u / v : u * v);
      }
    }
  });
}

// out = a / values[row] (divide) or a · values[row], each element rounded to out's dtype.
void RowBroadcast(TensorRef out, TensorRef a, const std::vector<double>& values, bool divide,
                  const Runtime& runtime) {
  ForEachRow(a.numel, values.size(), runtime,
             [&](std::size_t r, std::size_t begin, std::size_t end) {
               const auto v = static_cast<float>(values[r]);
               if (a.dtype == DType::kF32 && out.dtype == DType::kF32) {  // vectorized
                 const float* x = static_cast<const float*>(a.data);
                 float* y = static_cast<float*>(out.data);
                 if (divide) {
                   for (std::size_t i = begin; i < end; ++i) y[i] = x[i] / v;
                 } else {
                   for (std::size_t i = begin; i < end; ++i) y[i] = x[i] * v;
                 }
                 return;
               }
               for (std::size_t i = begin; i < end; ++i) {
                 const float x = LoadAsF32(a.data, a.dtype, i);
                 StoreFromF32(out.data, out.dtype, i, divide ? x / v : x * v);
               }
             });
}

// A tensor of the for-loop step: a view of a segment's buffer, or a temporary that owns its memory,
// allocated when made and freed with its last handle, as ATen's CPU allocator does (no caching).
struct Tensor {
  TensorRef ref;
  std::shared_ptr<std::byte> storage;  // empty for a segment's buffer
  algos::Shape shape = algos::Shape::kParam;
};

struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

// Runs a descriptor's StandardStep (src/algos/descriptor.h) on one segment: every op is one pass of
// the ATen-like ops of elementwise.h over the tensor, temporaries in the param's dtype. Methods
// carry torch's op names.
// NOLINTBEGIN(readability-identifier-naming)
class TensorOps {
 public:
  // `placeholder`: see SegmentsStep.
  TensorOps(const Segment& s, const Runtime& runtime, bool placeholder) : s_(s), runtime_(runtime) {
    if (placeholder) placeholder_.reset(new (std::align_val_t{64}) std::byte[0]);
  }

  std::int64_t step() const { return s_.step; }
  Tensor param() const { return {{s_.param, s_.param_dtype, s_.numel}, nullptr}; }
  Tensor grad() const { return {{const_cast<void*>(s_.grad), s_.grad_dtype, s_.numel}, nullptr}; }
  Tensor state(int slot) const { return {{s_.state[slot], s_.state_dtype, s_.numel}, nullptr}; }
  Tensor state(int slot, algos::Shape shape) const {
    return {{s_.state[slot], s_.state_dtype, DimsOf(s_, shape).numel()}, nullptr, shape};
  }
  // A factored param (descriptor.h): Segment::rows × cols matrices.
  bool matrices() const { return s_.cols > 0; }
  std::size_t size(int dim) const { return dim == -1 ? s_.cols : s_.rows; }

  // In place: x.op_(...).
  Tensor mul_(const Tensor& x, double s) const { return Run(Op::kMulScalar, x, x, x, x, s); }
  Tensor mul_(const Tensor& x, const Tensor& b) const { return Run(Op::kMul, x, x, b, b, 0.0); }
  Tensor div_(const Tensor& x, const Tensor& b) const {
    if (b.shape != x.shape) {
      Broadcast(/*divide=*/true, x.ref, DimsOf(s_, x.shape), x.ref, DimsOf(s_, x.shape), b.ref,
                DimsOf(s_, b.shape), runtime_);
      return x;
    }
    RunBaselineOp(BaselineOp::kDivide, x.ref, x.ref, b.ref, runtime_);
    return x;
  }
  Tensor div_(const Tensor& x, double s) const { return Run(Op::kDivScalar, x, x, x, x, s); }
  Tensor square_(const Tensor& x) const { return Run(Op::kMul, x, x, x, x, 0.0); }
  Tensor rsqrt_(const Tensor& x) const {
    RunBaselineOp(BaselineOp::kRsqrt, x.ref, x.ref, x.ref, runtime_);
    return x;
  }
  Tensor add_(const Tensor& x, double s) const { return Run(Op::kAddScalar, x, x, x, x, s); }
  Tensor add_(const Tensor& x, const Tensor& b, double alpha) const {
    return Run(Op::kAddScaled, x, x, b, b, alpha);
  }
  Tensor lerp_(const Tensor& x, const Tensor& b, double w) const {
    return Run(Op::kLerp, x, x, b, b, w);
  }
  Tensor addcmul_(const Tensor& x, const Tensor& b, const Tensor& c, double value) const {
    return Run(Op::kAddcmul, x, x, b, c, value);
  }
  Tensor addcdiv_(const Tensor& x, const Tensor& b, const Tensor& c, double value) const {
    return Run(Op::kAddcdiv, x, x, b, c, value);
  }
  Tensor sqrt_(const Tensor& x) const { return Run(Op::kSqrt, x, x, x, x, 0.0); }
  Tensor sgn_(const Tensor& x) const {
    RunBaselineOp(BaselineOp::kSign, x.ref, x.ref, x.ref, runtime_);
    return x;
  }
  Tensor clamp_(const Tensor& x, double lo, double hi) const {
    RunBaselineOp(BaselineOp::kClamp, x.ref, x.ref, x.ref, runtime_,
                  {.lo = static_cast<float>(lo), .hi = static_cast<float>(hi)});
    return x;
  }
  Tensor masked_fill_(const Tensor& x, const Tensor& c, algos::Compare compare, double threshold,
                      double value) const {
    RunBaselineOp(BaselineOp::kMaskedFill, x.ref, x.ref, c.ref, runtime_,
                  {.compare = compare,
                   .threshold = static_cast<float>(threshold),
                   .value = static_cast<float>(value)});
    return x;
  }
  Tensor copy_(const Tensor& x, const Tensor& a) const { return Run(Op::kCopy, x, a, a, a, 0.0); }
  Tensor maximum(const Tensor& a, const Tensor& b, const Tensor& out) const {
    return Run(Op::kMaximum, out, a, b, b, 0.0);
  }

  // Out of place: a new tensor.
  Tensor neg(const Tensor& a) const { return Run(Op::kNeg, New(a.shape), a, a, a, 0.0); }
  Tensor abs(const Tensor& a) const { return Run(Op::kAbs, New(a.shape), a, a, a, 0.0); }
  Tensor reciprocal(const Tensor& a) const {
    return Run(Op::kReciprocal, New(a.shape), a, a, a, 0.0);
  }
  Tensor mul(const Tensor& a, const Tensor& b) const {
    return Run(Op::kMul, New(a.shape), a, b, b, 0.0);
  }
  Tensor clone(const Tensor& a) const { return Run(Op::kCopy, New(a.shape), a, a, a, 0.0); }
  Tensor mul(const Tensor& a, double s) const {
    return Run(Op::kMulScalar, New(a.shape), a, a, a, s);
  }
  Tensor div(const Tensor& a, double s) const {
    return Run(Op::kDivScalar, New(a.shape), a, a, a, s);
  }
  Tensor div(const Tensor& a, const Tensor& b) const {
    Tensor out = New(a.shape);
    RunBaselineOp(BaselineOp::kDivide, out.ref, a.ref, b.ref, runtime_);
    return out;
  }
  Tensor sign(const Tensor& a) const {
    Tensor out = New(a.shape);
    RunBaselineOp(BaselineOp::kSign, out.ref, a.ref, a.ref, runtime_);
    return out;
  }
  Tensor add(const Tensor& a, double s) const {
    return Run(Op::kAddScalar, New(a.shape), a, a, a, s);
  }
  Tensor add(const Tensor& a, const Tensor& b, double alpha) const {
    return Run(Op::kAddScaled, New(a.shape), a, b, b, alpha);
  }
  Tensor sqrt(const Tensor& a) const { return Run(Op::kSqrt, New(a.shape), a, a, a, 0.0); }
  Tensor addcmul(const Tensor& a, const Tensor& b, const Tensor& c, double value) const {
    return Run(Op::kAddcmul, New(a.shape), a, b, c, value);
  }

  double norm(const Tensor& a) const { return RunNorm2(a.ref, runtime_); }

  // The factored ops (descriptor.h), on handles of a Shape of the segment's matrices.
  Tensor norm(const Tensor& a, int dim) const {
    return Reduce(a, dim, /*squares=*/true, [](double sum) {
      return static_cast<float>(std::sqrt(sum));  // an f32 norm
    });
  }
  Tensor mean(const Tensor& a, int dim) const {
    const double n =
        static_cast<double>(dim == -1 ? DimsOf(s_, a.shape).cols : DimsOf(s_, a.shape).rows);
    return Reduce(a, dim, /*squares=*/false,
                  [n](double sum) { return static_cast<float>(sum / n); });
  }
  Tensor matmul(const Tensor& a, const Tensor& b) const {
    Tensor out = New(algos::Shape::kParam);
    Broadcast(/*divide=*/false, out.ref, DimsOf(s_, out.shape), a.ref, DimsOf(s_, a.shape), b.ref,
              DimsOf(s_, b.shape), runtime_);
    return out;
  }

  // The row ops (descriptor.h): over the segment's view(rows, -1).
  std::size_t rows() const { return s_.rows; }
  std::size_t numel() const { return s_.numel; }
  std::vector<double> row_norms(const Tensor& a, std::size_t rows) const {
    std::vector<double> out = RowReduce(a.ref, rows, /*squares=*/true, runtime_);
    for (double& x : out) x = static_cast<float>(std::sqrt(x));  // an f32 result, as torch's
    return out;
  }
  std::vector<double> row_sums(const Tensor& a, std::size_t rows) const {
    return RowReduce(a.ref, rows, /*squares=*/false, runtime_);
  }
  Tensor div_rows(const Tensor& a, const std::vector<double>& values) const {
    Tensor out = New(a.shape);
    RowBroadcast(out.ref, a.ref, values, /*divide=*/true, runtime_);
    return out;
  }
  Tensor mul_rows(const Tensor& a, const std::vector<double>& values) const {
    Tensor out = New(a.shape);
    RowBroadcast(out.ref, a.ref, values, /*divide=*/false, runtime_);
    return out;
  }

 private:
  Tensor New(algos::Shape shape) const {
    const std::size_t numel = DimsOf(s_, shape).numel();
    std::shared_ptr<std::byte> bytes(
        new (std::align_val_t{64}) std::byte[numel * DTypeSize(s_.param_dtype)], AlignedFree{},
        std::pmr::polymorphic_allocator<std::byte>(&counts_));
    TensorRef ref{bytes.get(), s_.param_dtype, numel};
    return {ref, std::move(bytes), shape};
  }
  template <class Finish>
  Tensor Reduce(const Tensor& a, int dim, bool squares, const Finish& finish) const {
    Tensor out = New(algos::Reduced(a.shape, dim));
    ReduceDim(out.ref, a.ref, DimsOf(s_, a.shape), dim, squares, finish, runtime_);
    return out;
  }
  // out = op(a, b, c, s) in one pass (b and c ignored by ops that do not read them); returns out.
  Tensor Run(Op op, Tensor out, const Tensor& a, const Tensor& b, const Tensor& c, double s) const {
    RunOp(op, out.ref, a.ref, b.ref, c.ref, static_cast<float>(s), runtime_);
    return out;
  }

  std::unique_ptr<std::byte[], AlignedFree> placeholder_;  // freed last, after every temporary
  const Segment& s_;
  const Runtime& runtime_;
  // The temporaries' reference counts live here, not on the heap, so their buffers are the only
  // heap blocks a step allocates: a small block between them would change when glibc returns freed
  // memory to the system, and with it the page faults `standard` pays for its temporaries.
  mutable std::array<std::byte, 2048> counts_buffer_;
  mutable std::pmr::monotonic_buffer_resource counts_{counts_buffer_.data(), counts_buffer_.size(),
                                                      std::pmr::null_memory_resource()};
};
// NOLINTEND(readability-identifier-naming)

// The `step` of StandardStep: the segments, one after another.
//
// With `placeholder`, each tensor's ops start with a 0-byte heap block, freed after its last
// temporary: the hand-written baselines of the one-pass algorithms made one (an empty gradient
// buffer), LAMB's did not. It moves no data, but glibc decides from the heap's layout when to
// return freed temporaries to the system: without it, Adam's, AdamW's and Lion's standard steps at
// 1M elements page-fault on both temporaries on every step (several times slower). Kept so that
// `standard` times what it has always timed.
class SegmentsStep {
 public:
  SegmentsStep(std::span<const Segment> segments, const Runtime& runtime, bool placeholder)
      : segments_(segments), runtime_(runtime), placeholder_(placeholder) {}
  template <class F>
  void ForEachTensor(F&& f) const {
    for (const Segment& s : segments_) {
      TensorOps t(s, runtime_, placeholder_);
      f(t);
    }
  }

 private:
  std::span<const Segment> segments_;
  const Runtime& runtime_;
  bool placeholder_;
};

}  // namespace

unsigned BenchRequiredStates(Algorithm a, const BenchHyper& h) {
  return WithDescriptor(a, [&](auto d) {
    using A = typename decltype(d)::type;
    return A::RequiredStates(h.Of<typename A::Hyper>());
  });
}

void FusedStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
               Runtime& runtime) {
  WithDescriptor(a, [&](auto d) {
    using Hyper = typename decltype(d)::type::Hyper;
    fusedopt::FusedStep(std::span<const Hyper>(&h.Of<Hyper>(), 1), segments, runtime);
  });
}

StepResult FusedTrainingStep(Algorithm a, const BenchHyper& h, std::span<Segment> segments,
                             const TrainingStepOptions& options, Runtime& runtime) {
  return WithDescriptor(a, [&](auto d) {
    using Hyper = typename decltype(d)::type::Hyper;
    return TrainingStep(std::span<const Hyper>(&h.Of<Hyper>(), 1), segments, options, runtime);
  });
}

ReductionTraffic::ReductionTraffic(Algorithm a, std::span<const Segment> segments) {
  if (!tools::HasReductionPass(a)) return;
  const algos::ReductionReads reads = tools::ReductionReadsOf(a);
  grad_only_ = reads == algos::ReductionReads::kGrad;
  for (Segment s : segments) {
    if (!tools::ReducesSegment(a, s)) continue;
    std::size_t per_element = DTypeSize(s.grad_dtype);
    if (!grad_only_) per_element += DTypeSize(s.param_dtype);
    for (void*& state : s.state) {
      if (state == nullptr) continue;
      if (reads == algos::ReductionReads::kAll) {
        per_element += DTypeSize(s.state_dtype);
        // 8-bit states: each block's absmax too
        if (s.state_dtype == DType::kQ8) bytes_ += NumQuantBlocks(s.numel) * sizeof(float);
      } else {
        state = nullptr;
      }
    }
    bytes_ += s.numel * per_element;
    segments_.push_back(s);
  }
}

void ReductionTraffic::Run(const Runtime& runtime, TrafficLoop loop) const {
  if (segments_.empty()) return;
  if (grad_only_) {
    SameTrafficGradRead(segments_, runtime, loop.pace);
  } else {
    SameTrafficReduce(segments_, runtime, loop.pace);
  }
}

FactoredTraffic::FactoredTraffic(Algorithm a, std::span<const Segment> segments) {
  WithDescriptor(a, [&](auto d) {
    using A = typename decltype(d)::type;
    if constexpr (algos::Factored<A>) {
      for (Segment s : segments) {
        const unsigned slots = A::SegmentStates(s);
        std::size_t elementwise = 0;
        bool small = false;
        for (int k = 0; k < kMaxStates; ++k) {
          const bool used = (slots >> k & 1u) != 0 && s.state[k] != nullptr;
          if (used && DimsOf(s, A::kStateShapes[k]).numel() == s.numel) {
            ++elementwise;
          } else {
            small = small || used;
            s.state[k] = nullptr;
          }
        }
        const std::size_t p = DTypeSize(s.param_dtype);
        const std::size_t g = DTypeSize(s.grad_dtype);
        const std::size_t st = DTypeSize(s.state_dtype) * elementwise;
        bytes_ += s.numel * ((p + g + st) + (small ? g : 0) + (2 * p + g + 2 * st));
        passes_.push_back(s);
        if (small) matrices_.push_back(s);
      }
    } else {
      throw std::invalid_argument(std::string(A::kName) + " is not a factored algorithm");
    }
  });
}

void FactoredTraffic::Run(const Runtime& runtime, TrafficLoop loop) const {
  SameTrafficReduce(passes_, runtime, loop.pace);
  if (!matrices_.empty()) SameTrafficGradRead(matrices_, runtime, loop.pace);
  SameTrafficStep(passes_, runtime, loop);
}

void StandardStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
                  const Runtime& runtime) {
  WithDescriptor(a, [&](auto d) {
    using A = typename decltype(d)::type;
    SegmentsStep step(segments, runtime, /*placeholder=*/!algos::TwoPhase<A>);
    A::StandardStep(h.Of<typename A::Hyper>(), h.standard, step);
  });
}

}  // namespace fusedopt::baselines
