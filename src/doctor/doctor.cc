#include "src/doctor/doctor.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "bench/pipeline.h"
#include "bench/same_traffic.h"
#include "bench/standard.h"
#include "fusedopt/dtype.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/runtime.h"
#include "src/doctor/distributed_plan.h"
#include "src/doctor/model_shapes.h"
#include "src/doctor/report_util.h"

namespace fusedopt::bench {
namespace {

[[noreturn]] void Bad(const std::string& field, const std::string& option,
                      const std::string& what) {
  throw std::invalid_argument(field + " (" + option + "): " + what);
}

Algorithm CheckedAlgorithm(const DoctorOptions& o) {
  Algorithm a{};
  try {
    a = ParseAlgorithm(o.optimizer);
  } catch (const std::invalid_argument&) {
    Bad("optimizer", "--optimizer",
        "unknown optimizer '" + o.optimizer + "'; known: " + AlgorithmNames());
  }
  return a;
}

DType CheckedDType(const DoctorOptions& o) {
  DType dtype = DType::kF32;
  if (!ParseDType(o.dtype, &dtype))
    Bad("dtype", "--dtype", "unknown dtype '" + o.dtype + "'; known: f32, bf16, f16");
  return dtype;
}

// The reference's default weight decay when none is given (NaN), the Hyper struct's: AdamW 1e-2,
// LAMB 1e-2 (apex FusedLAMB's), every other optimizer 0 (Lion: lion-pytorch's 0; Rprop has none).
double EffectiveWeightDecay(const DoctorOptions& o, Algorithm a) {
  if (!std::isnan(o.weight_decay)) return o.weight_decay;
  return WithDescriptor(a, [](auto d) -> double {
    using Hyper = typename decltype(d)::type::Hyper;
    if constexpr (requires(Hyper h) { h.weight_decay; }) {
      return Hyper{}.weight_decay;
    } else {
      return 0.0;
    }
  });
}

// Where DoctorOptions::numels come from, for messages.
constexpr const char* kNumelsSource = "--numels, --shapes or the trace's otherData.param_numels";

// Everything the op counts depend on, checked once (the arguments torch.optim itself rejects are
// rejected here too, naming the field and the value).
struct Model {
  Algorithm algorithm;
  DType dtype;
  double weight_decay;
  std::size_t num_tensors;
  std::size_t numel;
};

Model CheckedModel(const DoctorOptions& o) {
  const Algorithm a = CheckedAlgorithm(o);
  const DType dtype = CheckedDType(o);
  const double wd = EffectiveWeightDecay(o, a);
  if (!std::isfinite(wd) || wd < 0.0)
    Bad("weight_decay", "--weight-decay", "must be a finite number >= 0, got " + Num(wd));
  if (!std::isfinite(o.momentum) || o.momentum < 0.0)
    Bad("momentum", "--momentum", "must be a finite number >= 0, got " + Num(o.momentum));
  const Algorithm sgd = AlgorithmOf<algos::Sgd>();
  if (o.momentum != 0.0 && a != sgd && a != AlgorithmOf<algos::Rmsprop>())
    Bad("momentum", "--momentum", "applies to sgd and rmsprop only, got " + Num(o.momentum));
  if (o.nesterov && (a != sgd || o.momentum <= 0.0))
    Bad("nesterov", "--nesterov", "needs --optimizer sgd and --momentum > 0 (as torch.optim.SGD)");
  if (o.clip && (!std::isfinite(*o.clip) || !(*o.clip > 0.0)))
    Bad("clip", "--clip", "invalid max norm '" + Num(*o.clip) + "' (a finite number > 0)");
  if (o.numels.empty()) Bad("numels", kNumelsSource, "no parameter tensors given");
  std::size_t numel = 0;
  for (std::size_t i = 0; i < o.numels.size(); ++i) {
    if (o.numels[i] == 0)
      Bad("numels", kNumelsSource, "tensor " + std::to_string(i) + " has 0 elements");
    numel = CheckedAdd(numel, o.numels[i], "numels (" + std::string(kNumelsSource) + "): the sum");
  }
  return {a, dtype, wd, o.numels.size(), numel};
}

// The hyper-parameters the doctor takes, given to every algorithm that has them; torch's defaults
// for the rest (SGD: lr 1e-3).
BenchHyper MakeHyper(const Model& m, const DoctorOptions& o) {
  BenchHyper h;
  h.Of<SgdHyper>() = {.lr = 1e-3};
  algos::All::ForEach([&](auto d) {
    auto& hyper = h.Of<typename decltype(d)::type::Hyper>();
    if constexpr (requires { hyper.weight_decay; }) hyper.weight_decay = m.weight_decay;
    if constexpr (requires { hyper.momentum; }) hyper.momentum = o.momentum;
    if constexpr (requires { hyper.nesterov; }) hyper.nesterov = o.nesterov;
  });
  return h;
}

// The states the fused step keeps under these hyper-parameters, as FlatStorage allocates them.
std::size_t FusedStates(const Model& m, const DoctorOptions& o) {
  return static_cast<std::size_t>(std::popcount(BenchRequiredStates(m.algorithm, MakeHyper(m, o))));
}

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

// The descriptor's StandardStep (the reference's for-loop step, foreach=False; bench/standard.cc
// times the same sequence), counted. Scalar host work (Adam's step_t += 1, LAMB's clip coefficient
// and trust ratio) moves no tensor data and is not counted.
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

struct Timings {
  double fused_ms = 0.0;
  double same_traffic_ms = 0.0;
  std::optional<double> standard_ms;
  int threads = 0;
};

// Times the fused step, same_traffic and, if asked, the for-loop standard step on buffers of the
// given shapes (grads in the param dtype, as torch), interleaved in rotating order after two
// warm-up rounds, as `fusedopt bench` does. With clip, fused and standard are the training-loop
// steps of bench/pipeline.h (pre-pass + step; norms + clip + step) and same_traffic reads the
// grads once more; for a two-phase step (LAMB) it also reads what the reduction pass reads.
Timings Measure(const Model& m, const DoctorOptions& o, bool time_standard,
                std::ostream& progress) {
  const BenchHyper hyper = MakeHyper(m, o);
  Runtime runtime(o.threads);
  std::vector<TensorSpec> tensors;
  for (std::size_t n : o.numels) tensors.push_back({.numel = n});
  FlatStorage storage(tensors, 1,
                      {.param_dtype = m.dtype, .grad_dtype = m.dtype, .state_dtype = m.dtype},
                      BenchRequiredStates(m.algorithm, hyper));
  std::vector<Segment> segments(storage.segments().begin(), storage.segments().end());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Fill(segments[i].param, m.dtype, segments[i].numel, 1.0f, static_cast<std::uint32_t>(2 * i));
    Fill(const_cast<void*>(segments[i].grad), m.dtype, segments[i].numel, 1e-2f,
         static_cast<std::uint32_t>(2 * i + 1));
  }
  std::vector<Segment> standard_segments = segments;

  std::optional<FusedLoop> fused_loop;
  std::optional<StandardLoop> standard_loop;
  if (o.clip) {
    const LoopOptions loop{.scaler = std::nullopt, .max_norm = *o.clip};
    fused_loop.emplace(m.algorithm, hyper, segments, loop);
    standard_loop.emplace(m.algorithm, hyper, segments, loop);
  }
  struct Timed {
    std::string name;
    std::function<void()> run;
    std::vector<double> ms;
  };
  std::vector<Timed> impls;
  impls.push_back({"fused",
                   [&] {
                     if (fused_loop) return fused_loop->Run(runtime);
                     FusedStep(m.algorithm, hyper, segments, runtime);
                   },
                   {}});
  const bool reduction_pass = HasReductionPass(m.algorithm);
  std::optional<FactoredTraffic> factored;
  if (IsFactored(m.algorithm)) factored.emplace(m.algorithm, segments);
  impls.push_back({"same_traffic",
                   [&] {
                     if (o.clip) SameTrafficGradRead(segments, runtime);
                     if (factored) return factored->Run(runtime, TrafficStores::kRegular);
                     if (reduction_pass && ReductionReadsGradOnly(m.algorithm)) {
                       SameTrafficGradRead(segments, runtime);
                     } else if (reduction_pass) {
                       SameTrafficReduce(segments, runtime);
                     }
                     SameTrafficStep(segments, runtime);
                   },
                   {}});
  if (time_standard) {
    impls.push_back({"standard",
                     [&] {
                       if (standard_loop) return standard_loop->Run(runtime);
                       StandardStep(m.algorithm, hyper, standard_segments, runtime);
                     },
                     {}});
  }
  // Step counts start at 2: steady state (SGD's first step only copies the grad into its buffer).
  std::int64_t step = 1;
  const auto next_step = [&] {
    ++step;
    for (Segment& s : segments) s.step = step;
    for (Segment& s : standard_segments) s.step = step;
    if (fused_loop) fused_loop->SetStep(step);
    if (standard_loop) standard_loop->SetStep(step);
  };
  constexpr int kWarmup = 2;
  for (int w = 0; w < kWarmup; ++w) {
    next_step();
    for (Timed& t : impls) t.run();
  }
  for (int r = 0; r < o.rounds; ++r) {
    next_step();
    // Rotate the order so no implementation always runs right after another's cache footprint.
    for (std::size_t k = 0; k < impls.size(); ++k) {
      Timed& t = impls[(k + static_cast<std::size_t>(r)) % impls.size()];
      const auto t0 = std::chrono::steady_clock::now();
      t.run();
      const auto t1 = std::chrono::steady_clock::now();
      t.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    progress << "\r  round " << (r + 1) << "/" << o.rounds << std::flush;
  }
  progress << "\n";
  Timings out;
  out.fused_ms = Median(impls[0].ms);
  out.same_traffic_ms = Median(impls[1].ms);
  if (time_standard) out.standard_ms = Median(impls[2].ms);
  out.threads = runtime.num_threads();
  return out;
}

// The buffers Measure allocates (param, grad and each state per element) fit in memory: checked
// before allocating, since the sizes come from the command line or a trace.
void CheckBuffersFit(const Model& m, const DoctorOptions& o) {
  const FusedFootprint b = FusedFootprintOf(o);
  const std::string what = "numels (" + std::string(kNumelsSource) +
                           "): " + std::to_string(m.numel) + " elements of " + o.dtype;
  CheckFitsInMemory(CheckedMul(m.numel, b.param + b.grad + b.state, what), what);
}

void CheckStepOptions(const DoctorOptions& o) {
  if (!std::isfinite(o.step_ms) || !(o.step_ms > 0.0))
    Bad("step_ms", "--step-ms", "must be a finite number > 0, got " + Num(o.step_ms));
  if (o.optimizer_ms) {
    if (!std::isfinite(*o.optimizer_ms) || !(*o.optimizer_ms > 0.0))
      Bad("optimizer_ms", "--optimizer-ms",
          "must be a finite number > 0, got " + Num(*o.optimizer_ms));
    if (*o.optimizer_ms >= o.step_ms)
      Bad("optimizer_ms", "--optimizer-ms",
          "must be less than step_ms " + Num(o.step_ms) + ", got " + Num(*o.optimizer_ms));
  }
  if (o.threads < 0 || o.threads > kMaxThreads) {
    Bad("threads", "--threads",
        "must be 0.." + std::to_string(kMaxThreads) + ", got " + std::to_string(o.threads));
  }
  if (o.rounds < 1) Bad("rounds", "--rounds", "must be >= 1, got " + std::to_string(o.rounds));
}

// A duration in ms with enough digits to be read: 2 decimals from 1 ms, 3 significant digits below.
std::string Ms(double ms) {
  if (ms >= 1.0) return Fixed(ms, 2);
  std::ostringstream out;
  out << std::setprecision(3) << ms;
  return out.str();
}

nlohmann::json CountJson(const OpCount& c) {
  return {{"ops", c.ops}, {"passes", c.passes}, {"bytes", c.bytes}};
}

// The numbers the verdict is made of.
struct Findings {
  bool already_fused;
  double share;         // optimizer_ms / step_ms
  double amdahl_bound;  // step / (step - optimizer): removing the optimizer entirely
  double optimizer_ms;
  double fused_ms;
  double predicted_step_ms;
  double predicted_speedup;
  double standard_gb_per_s;
  double ceiling_gb_per_s;
  double same_traffic_ms;
  std::optional<double> standard_ms;  // timed here
  OpCount standard;
  OpCount fused;
};

// The seeds' troubleshooting, in plain language: how much of the step the optimizer is, what
// fusing can save at most and what it will save, and where to look instead when that is little.
std::string Verdict(const Findings& f) {
  std::ostringstream v;
  const std::string share = Fixed(100.0 * f.share, f.share < 0.1 ? 1 : 0) + " %";
  if (f.already_fused) {
    v << "This run already uses fusedopt: the optimizer is " << share << " of your step ("
      << Ms(f.optimizer_ms) << " ms).";
    if (f.standard_ms) {
      v << " A for-loop optimizer would take about " << Ms(*f.standard_ms)
        << " ms on these shapes (measured here), fusedopt " << Ms(f.fused_ms) << " ms.";
    }
    if (f.share < 0.1)
      v << " The rest of the step is elsewhere (data loading, forward and backward): look there.";
    return v.str();
  }
  v << "The optimizer is " << share << " of your step. Fusing it saves at most " << share
    << " (Amdahl bound " << Fixed(f.amdahl_bound, 2) << "x); fusedopt's step on these shapes takes "
    << Ms(f.fused_ms) << " ms instead of " << Ms(f.optimizer_ms) << " ms, so expect "
    << Fixed(f.predicted_speedup, 2) << "x end to end (a " << Ms(f.predicted_step_ms)
    << " ms step).";
  if (f.fused_ms >= f.optimizer_ms) {
    v << " fusedopt is not faster than your optimizer on these shapes: do not expect a gain.";
  }
  if (f.share < 0.1) {
    v << " The optimizer is not your bottleneck: the step is spent elsewhere (data loading, "
         "forward and backward); profile those first (a --trace shows the split).";
  } else if (f.share >= 0.3) {
    v << " The optimizer is a large part of your step: fusing it is worth it.";
  }
  if (f.standard_gb_per_s >= 0.7 * f.ceiling_gb_per_s) {
    const std::string rate = Fixed(f.standard_gb_per_s, 1) + " GB/s";
    const std::string ceiling = Fixed(f.ceiling_gb_per_s, 1) + " GB/s";
    if (f.standard_gb_per_s <= 1.05 * f.ceiling_gb_per_s) {
      v << " Your optimizer already runs near this machine's bandwidth ceiling (" << rate << " of "
        << ceiling << ")";
    } else {
      // Faster than the ceiling: the times come from a quieter or faster machine than this run.
      v << " Your optimizer's " << rate << " is above the bandwidth ceiling measured here ("
        << ceiling << "; is the machine busier now than when the step was timed?)";
    }
    v << ": fusing helps by moving fewer bytes (" << Fixed(f.fused.passes, 0) << " instead of "
      << Fixed(f.standard.passes, 0) << " passes), not by moving them faster.";
  }
  return v.str();
}

void PrintTable(std::ostream& out, const Findings& f, const std::string& optimizer_source) {
  const auto row = [&](const std::string& name, std::optional<OpCount> c, double ms,
                       std::optional<double> gbps, const std::string& note) {
    out << std::left << std::setw(24) << name << std::right;
    if (c) {
      out << std::setw(8) << c->ops << std::setw(8) << Fixed(c->passes, 1) << std::setw(11)
          << Fixed(static_cast<double>(c->bytes) / 1e6, 1);
    } else {
      out << std::setw(27) << "";
    }
    out << std::setw(10) << (ms >= 0.01 ? Fixed(ms, 3) : Ms(ms)) << std::setw(8)
        << (gbps ? Fixed(*gbps, 1) : "");
    if (!note.empty()) out << "  " << note;
    out << "\n";
  };
  out << std::left << std::setw(24) << "" << std::right << std::setw(8) << "ops" << std::setw(8)
      << "passes" << std::setw(11) << "MB moved" << std::setw(10) << "ms" << std::setw(8) << "GB/s"
      << "\n";
  const double fused_gbps = static_cast<double>(f.fused.bytes) / (f.fused_ms * 1e6);
  const std::string standard_name = f.already_fused ? "standard (for-loop)" : "your optimizer";
  const double standard_ms = f.already_fused ? f.standard_ms.value_or(0.0) : f.optimizer_ms;
  row(standard_name, f.standard, standard_ms,
      static_cast<double>(f.standard.bytes) / (standard_ms * 1e6),
      f.already_fused ? "(measured here)" : "(" + optimizer_source + ")");
  row(f.already_fused ? "fusedopt (measured here)" : "fusedopt", f.fused, f.fused_ms, fused_gbps,
      "");
  row("same_traffic (ceiling)", std::nullopt, f.same_traffic_ms, f.ceiling_gb_per_s,
      "(the fused bytes, trivial math)");
}

// Trimmed mean (report_util.h) of the durations (µs in the trace) of `pid`'s complete events called
// `name` whose args.step is in `steps`, in ms. Empty `steps`: every non-warm-up `step` span, whose
// indices are added to `steps` (so the optimizer spans of those steps can be picked next).
std::optional<double> TypicalSpanMs(const nlohmann::json& events, int pid, const std::string& name,
                                    std::set<std::int64_t>& steps, bool collect) {
  std::vector<double> ms;
  for (const nlohmann::json& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || e.value("name", "") != name) continue;
    if (!e.contains("pid") || !e["pid"].is_number_integer() || e["pid"].get<std::int64_t>() != pid)
      continue;
    const std::string event = "trace: a '" + name + "' event of pid " + std::to_string(pid);
    const nlohmann::json args = e.value("args", nlohmann::json::object());
    if (!args.is_object()) throw std::invalid_argument(event + " has args that are not an object");
    if (!e.contains("dur") || !e["dur"].is_number())
      throw std::invalid_argument(event + " has no numeric dur");
    if (!(e["dur"].get<double>() >= 0.0))
      throw std::invalid_argument(event + " has a negative dur " + e["dur"].dump());
    if (args.contains("warmup") && !args["warmup"].is_boolean())
      throw std::invalid_argument(event + " has args.warmup " + args["warmup"].dump() +
                                  ", not true or false");
    const std::int64_t step = args.contains("step") && args["step"].is_number_integer()
                                  ? args["step"].get<std::int64_t>()
                                  : -1;
    if (collect) {
      if (args.contains("warmup") && args["warmup"].get<bool>()) continue;
      steps.insert(step);
    } else if (!steps.contains(step)) {
      continue;
    }
    ms.push_back(e["dur"].get<double>() / 1000.0);
  }
  if (ms.empty()) return std::nullopt;
  return TrimmedMean(ms);
}

const nlohmann::json& Required(const nlohmann::json& obj, const std::string& key,
                               const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null())
    throw std::invalid_argument("trace: " + where + "." + key + " is missing");
  return obj[key];
}

// A number (or null: `fallback`) from otherData, checked.
double NumberOr(const nlohmann::json& other, const std::string& key, double fallback) {
  if (!other.contains(key) || other[key].is_null()) return fallback;
  if (!other[key].is_number())
    throw std::invalid_argument("trace: otherData." + key +
                                " is not a number: " + other[key].dump());
  return other[key].get<double>();
}

// The pid of each implementation name (otherData.impls maps pid strings to names).
std::map<std::string, int> ImplPids(const nlohmann::json& other) {
  const nlohmann::json& impls = Required(other, "impls", "otherData");
  if (!impls.is_object()) throw std::invalid_argument("trace: otherData.impls is not an object");
  std::map<std::string, int> pids;
  for (const auto& [pid, name] : impls.items()) {
    if (!name.is_string())
      throw std::invalid_argument("trace: otherData.impls." + pid + " is not a name");
    int value = 0;
    const auto [end, error] = std::from_chars(pid.data(), pid.data() + pid.size(), value);
    if (error != std::errc() || end != pid.data() + pid.size())
      throw std::invalid_argument("trace: otherData.impls has a non-numeric pid '" + pid + "'");
    pids[name.get<std::string>()] = value;
  }
  return pids;
}

struct ImplTimes {
  double step_ms;
  double optimizer_ms;
};

ImplTimes TimesOf(const nlohmann::json& events, const std::string& impl, int pid) {
  std::set<std::int64_t> steps;
  const std::string who = " of impl " + impl + " (pid " + std::to_string(pid) + ")";
  const std::optional<double> step = TypicalSpanMs(events, pid, "step", steps, true);
  if (!step) throw std::invalid_argument("trace: no non-warm-up 'step' span" + who);
  const std::optional<double> opt = TypicalSpanMs(events, pid, "optimizer", steps, false);
  if (!opt) throw std::invalid_argument("trace: no 'optimizer' span in a non-warm-up step" + who);
  return {*step, *opt};
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
  // reads the param, the grad and each state once more (BertAdam's the grad only; as `fusedopt
  // bench` counts it); the
  // pre-pass reads the grads again.
  std::size_t passes = 2 + 1 + 2 * states;
  std::size_t ops = 1;
  if (IsFactored(m.algorithm)) {
    // Adafactor's doctor tensors are vectors (numels only): the stats pass reads the param, the
    // grad and the variance, the update pass reads and writes the param and the variance and
    // reads the grad (FactoredTraffic's bytes).
    passes = 3 + 5;
    ops = 2;
  }
  if (HasReductionPass(m.algorithm)) {
    passes += ReductionReadsGradOnly(m.algorithm) ? 1 : 1 + 1 + states;
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

nlohmann::json Diagnose(const DoctorOptions& options, std::ostream& report,
                        std::ostream& progress) {
  const Model m = CheckedModel(options);
  CheckStepOptions(options);
  // Before timing, so that a bad flag fails at once.
  if (!options.ranks.empty()) CheckDistributedOptions(options);
  CheckBuffersFit(m, options);
  const bool already_fused = options.impl == "fused";
  const OpCount standard = CountStandardOps(options);
  const OpCount fused = CountFusedOps(options);
  // Already fused: the traced optimizer time is fusedopt's; time the for-loop here to compare.
  const bool time_standard = !options.optimizer_ms || already_fused;

  progress << "fusedopt doctor: " << options.optimizer << " on " << m.num_tensors << " tensors ("
           << FormatCount(m.numel) << " params), " << options.dtype << ", timing fused, "
           << "same_traffic" << (time_standard ? " and standard" : "") << ", " << options.rounds
           << " rounds\n";
  const Timings t = Measure(m, options, time_standard, progress);

  const std::string source = options.optimizer_ms ? options.optimizer_ms_source : "measured";
  const double optimizer_ms = options.optimizer_ms ? *options.optimizer_ms : *t.standard_ms;
  if (optimizer_ms >= options.step_ms) {
    Bad("optimizer_ms", "measured",
        "the standard optimizer takes " + Num(optimizer_ms) + " ms here, not less than step_ms " +
            Num(options.step_ms) + ": give --optimizer-ms or check --step-ms");
  }
  Findings f{.already_fused = already_fused,
             .share = optimizer_ms / options.step_ms,
             .amdahl_bound = options.step_ms / (options.step_ms - optimizer_ms),
             .optimizer_ms = optimizer_ms,
             .fused_ms = t.fused_ms,
             .predicted_step_ms = options.step_ms - optimizer_ms + t.fused_ms,
             .predicted_speedup = 0.0,
             .standard_gb_per_s = static_cast<double>(standard.bytes) / (optimizer_ms * 1e6),
             .ceiling_gb_per_s = static_cast<double>(fused.bytes) / (t.same_traffic_ms * 1e6),
             .same_traffic_ms = t.same_traffic_ms,
             .standard_ms = t.standard_ms,
             .standard = standard,
             .fused = fused};
  if (already_fused) f.predicted_step_ms = options.step_ms;
  f.predicted_speedup = options.step_ms / f.predicted_step_ms;
  const std::string verdict = Verdict(f);

  nlohmann::json j = {
      {"optimizer", options.optimizer},
      {"dtype", options.dtype},
      {"weight_decay", m.weight_decay},
      {"momentum", options.momentum},
      {"nesterov", options.nesterov},
      {"clip", options.clip ? nlohmann::json(*options.clip) : nlohmann::json(nullptr)},
      {"num_tensors", m.num_tensors},
      {"numel", m.numel},
      {"threads", t.threads},
      {"target", ActiveTargetName()},
      {"rounds", options.rounds},
      {"impl", options.impl.empty() ? nlohmann::json(nullptr) : nlohmann::json(options.impl)},
      {"already_fused", already_fused},
      {"step_ms", options.step_ms},
      {"optimizer_ms", optimizer_ms},
      {"optimizer_ms_source", source},
      {"optimizer_share", f.share},
      {"standard", CountJson(standard)},
      {"fused", CountJson(fused)},
      {"measured",
       {{"fused_ms", t.fused_ms},
        {"same_traffic_ms", t.same_traffic_ms},
        {"standard_ms", t.standard_ms ? nlohmann::json(*t.standard_ms) : nlohmann::json(nullptr)},
        {"ceiling_gb_per_s", f.ceiling_gb_per_s},
        {"fused_gb_per_s", static_cast<double>(fused.bytes) / (t.fused_ms * 1e6)},
        {"standard_gb_per_s", f.standard_gb_per_s}}},
      {"amdahl_bound", f.amdahl_bound},
      {"predicted_step_ms", f.predicted_step_ms},
      {"predicted_speedup", f.predicted_speedup},
      {"predicted_bound_gain_captured",
       already_fused ? nlohmann::json(nullptr)
                     : nlohmann::json((f.predicted_speedup - 1.0) / (f.amdahl_bound - 1.0))},
      {"verdict", verdict}};
  if (options.trace_fused_step_ms && !already_fused) {
    j["trace_fused"] = {{"step_ms", *options.trace_fused_step_ms},
                        {"measured_speedup", options.step_ms / *options.trace_fused_step_ms}};
  }

  report << "fusedopt doctor: " << options.optimizer << " on " << m.num_tensors << " tensors ("
         << FormatCount(m.numel) << " params), " << options.dtype << ", " << t.threads
         << " threads, target " << TargetDescription(ActiveTargetName());
  if (!options.impl.empty()) report << "; traced impl " << options.impl;
  report << "\n";
  PrintTable(report, f, source);
  if (options.impl == "foreach" || options.impl == "torch_fused") {
    report << "(the counts model the for-loop optimizer; " << options.impl
           << " makes fewer launches over the same or fewer bytes: its time is the trace's)\n";
  }
  report << "step " << Ms(options.step_ms) << " ms, optimizer " << Ms(optimizer_ms) << " ms ("
         << Fixed(100.0 * f.share, 1) << " %, " << source << "); Amdahl bound "
         << Fixed(f.amdahl_bound, 3) << "x; predicted step " << Ms(f.predicted_step_ms)
         << " ms, speedup " << Fixed(f.predicted_speedup, 3) << "x";
  if (!already_fused) {
    report << " (" << Fixed(100.0 * j["predicted_bound_gain_captured"].get<double>(), 0)
           << " % of the bound)";
  }
  report << "\n";
  if (j.contains("trace_fused")) {
    report << "the trace's fused run: step " << Ms(*options.trace_fused_step_ms)
           << " ms, measured speedup "
           << Fixed(j["trace_fused"]["measured_speedup"].get<double>(), 3) << "x\n";
  }
  report << "verdict: " << verdict << "\n";
  if (!options.ranks.empty()) {
    // The rest of the step (forward, backward, data) is the measured step without its optimizer.
    const std::vector<DistributedRow> plan =
        PlanDistributed(options, t.fused_ms, options.step_ms - optimizer_ms);
    PrintDistributedPlan(report, options, plan);
    j["distributed"] = DistributedJson(plan);
    j["distributed_model"] = DistributedModelJson(options);
  }
  return j;
}

DoctorOptions DoctorOptionsFromTrace(const nlohmann::json& trace) {
  if (!trace.is_object()) throw std::invalid_argument("trace: not a JSON object");
  const nlohmann::json& other = Required(trace, "otherData", "trace");
  const nlohmann::json& events = Required(trace, "traceEvents", "trace");
  if (!events.is_array()) throw std::invalid_argument("trace: traceEvents is not an array");

  // The one format version this reader knows (docs/trace-format.md): a later one may mean
  // something else by the same fields.
  const nlohmann::json& version = Required(other, "fusedopt_trace", "otherData");
  if (version != 1) {
    throw std::invalid_argument("trace: otherData.fusedopt_trace is " + version.dump() +
                                ", a format version this doctor does not read (it reads 1)");
  }
  DoctorOptions o;
  const nlohmann::json& optimizer = Required(other, "optimizer", "otherData");
  if (!optimizer.is_string())
    throw std::invalid_argument("trace: otherData.optimizer is not a string");
  o.optimizer = optimizer.get<std::string>();
  const nlohmann::json& numels = Required(other, "param_numels", "otherData");
  if (!numels.is_array() || numels.empty())
    throw std::invalid_argument("trace: otherData.param_numels is not a non-empty array");
  std::size_t total = 0;
  for (const nlohmann::json& n : numels) {
    if (!n.is_number_unsigned() || n.get<std::size_t>() == 0) {
      throw std::invalid_argument("trace: otherData.param_numels has a bad entry " + n.dump() +
                                  " (element counts are whole numbers > 0)");
    }
    o.numels.push_back(n.get<std::size_t>());
    total = CheckedAdd(total, o.numels.back(), "trace: otherData.param_numels: the sum");
  }
  // param_dtype is the dtype of the params and their states; dtype is the run's (autocast) one.
  // The first given wins; each given one must be a name (CheckedDType checks which).
  bool dtype_given = false;
  for (const char* key : {"param_dtype", "dtype"}) {
    if (!other.contains(key) || other[key].is_null()) continue;
    if (!other[key].is_string()) {
      throw std::invalid_argument("trace: otherData." + std::string(key) +
                                  " is not a string: " + other[key].dump());
    }
    if (!dtype_given) o.dtype = other[key].get<std::string>();
    dtype_given = true;
  }
  o.weight_decay = NumberOr(other, "weight_decay", o.weight_decay);
  o.momentum = NumberOr(other, "momentum", 0.0);
  if (other.contains("nesterov") && !other["nesterov"].is_null()) {
    if (!other["nesterov"].is_boolean()) {
      throw std::invalid_argument("trace: otherData.nesterov is not true or false: " +
                                  other["nesterov"].dump());
    }
    o.nesterov = other["nesterov"].get<bool>();
  }
  if (other.contains("max_grad_norm") && !other["max_grad_norm"].is_null())
    o.clip = NumberOr(other, "max_grad_norm", 0.0);
  const double threads = NumberOr(other, "threads", 0.0);
  if (!(threads >= 0.0 && threads <= kMaxThreads && threads == std::floor(threads))) {
    throw std::invalid_argument("trace: otherData.threads must be a whole number in 0.." +
                                std::to_string(kMaxThreads) + ", got " + Num(threads));
  }
  o.threads = static_cast<int>(threads);

  const std::map<std::string, int> pids = ImplPids(other);
  for (const char* impl : {"torch", "foreach", "torch_fused", "fused"}) {
    if (!pids.contains(impl)) continue;
    o.impl = impl;
    break;
  }
  if (o.impl.empty())
    throw std::invalid_argument(
        "trace: otherData.impls names none of torch, foreach, "
        "torch_fused, fused");
  const ImplTimes times = TimesOf(events, o.impl, pids.at(o.impl));
  o.step_ms = times.step_ms;
  o.optimizer_ms = times.optimizer_ms;
  o.optimizer_ms_source = "trace";
  if (o.impl != "fused" && pids.contains("fused"))
    o.trace_fused_step_ms = TimesOf(events, "fused", pids.at("fused")).step_ms;
  return o;
}

}  // namespace fusedopt::bench
