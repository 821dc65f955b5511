// Kernel tests: the public <Algo>Step entry points (step.h) against the double-precision oracle in
// tests/reference/reference.h, once per SIMD target (style.md §9). Each suite is instantiated per
// target, named Targets/<Suite>.<Algo>/<TARGET>:
//   KernelSweep    option combinations × dtype combos × base offset × {1, 20} steps ({1, 3} with
//                  FOPT_TEST_SMALL), each one
//                  call over segments of sizes {0, 1, 7, 8, 9, 63, 64, 65} in two groups with
//                  different lr/weight_decay and different per-segment step counts;
//   KernelMixed    every option combination as its own group with its own segment, all dtype combos
//                  in one call;
//   KernelLarge    4099 elements on every 16-bit combo (bias check) and 1000003 elements on two
//                  combos (skipped when FOPT_TEST_SMALL is set), with Runtime(2);
//   KernelSpecial  zero, huge, eps-dominated and NaN/Inf gradients; zero-size segments;
//   Determinism    Runtime(1) vs Runtime(2) vs Runtime(3), bit for bit, over several 32768-element
//                  chunks; for the algorithms whose cases say so also across targets
//                  (DeterminismAcrossTargets).
// Each algorithm of the registry's list runs them with its cases, ref::KernelCases in
// tests/reference/<algo>.h (Algo below says what they hold): this file names no algorithm. An
// algorithm with factored states runs the shaped sweep instead (KernelSweep and Determinism).
//
// Pass rules. f32 storage: |k − r| ≤ max(rtol·|r|, atol), with rtol 2e-6 after one step and 1e-5
// after 20, atol = 8·FLT_EPSILON·max|r| (max over the buffer's oracle values before and after the
// step), both ×10 on non-FMA targets. Segments whose persistent buffers are all f32 (f32 param or
// master, f32 state) run free against the oracle and are compared after the last step. A 16-bit
// param (without master) or state is checked one step at a time: the oracle starts each step from
// the kernel's rounded buffers, and its rounded result must be within 1 ulp of the storage type (or
// within the f32 atol, which only matters after cancellation near zero). A 16-bit param with a
// master must equal the rounding of the kernel's own master exactly. 16-bit buffers of ≥ 4096
// elements also get a bias check: the mean signed ulp distance from the rounded oracle must stay
// below 0.25, which catches truncation instead of rounding (about −0.5).

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#ifdef FOPT_TEST_ALGORITHMS_DIR
#  include "tests/algos/registry.h"
#endif
#include "tests/reference/reference.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

// ------------------------------------------------------------------------------------------------
// Targets

// Forces one SIMD target for its lifetime and restores the default afterwards.
class ForcedTarget {
 public:
  explicit ForcedTarget(const std::string& name) { ForceTarget(name); }
  ~ForcedTarget() { ForceTarget(""); }
  ForcedTarget(const ForcedTarget&) = delete;
  ForcedTarget& operator=(const ForcedTarget&) = delete;
};

// MulAdd fuses only on AVX2 and up; elsewhere tolerances are 10x wider (style.md §6).
bool IsFmaTarget(const std::string& name) {
  return name.starts_with("AVX2") || name.starts_with("AVX3");
}

using test::SmallOnly;

using test::Rng;

// ------------------------------------------------------------------------------------------------
// Dtype combos and buffers

using ref::Combo;

std::string ComboName(const Combo& c) {
  std::string s = std::string(DTypeName(c.param)) + "/" + std::string(DTypeName(c.grad)) + "/" +
                  std::string(DTypeName(c.state));
  return c.master ? s + "+master" : s;
}

constexpr DType kF32 = DType::kF32;
constexpr DType kF16 = DType::kF16;
constexpr DType kBF16 = DType::kBF16;

// Every param/grad/state dtype combination (27), and each one with a 16-bit param also with an f32
// master copy (18 more).
std::vector<Combo> AllCombos() {
  std::vector<Combo> out;
  for (bool master : {false, true}) {
    for (DType p : {kF32, kBF16, kF16}) {
      if (master && p == kF32) continue;
      for (DType g : {kF32, kBF16, kF16}) {
        for (DType st : {kF32, kBF16, kF16}) out.push_back({p, g, st, master});
      }
    }
  }
  return out;
}

// A buffer of n elements of one dtype, 64-byte aligned or one element past that ("unaligned").
// Every byte around the n elements is a guard that must survive the test.
class Buffer {
 public:
  static constexpr std::uint8_t kGuard = 0xA5;

  Buffer(DType dtype, std::size_t n, bool unaligned)
      : dtype_(dtype), n_(n), bytes_((n + 1) * DTypeSize(dtype) + 128, kGuard) {
    const auto base = reinterpret_cast<std::uintptr_t>(bytes_.data());
    const std::size_t pad = ((base + 63) & ~std::uintptr_t{63}) - base;
    begin_ = pad + (unaligned ? DTypeSize(dtype) : 0);
  }

  DType dtype() const { return dtype_; }
  std::size_t size() const { return n_; }
  void* data() { return bytes_.data() + begin_; }
  const void* data() const { return bytes_.data() + begin_; }
  std::size_t num_bytes() const { return n_ * DTypeSize(dtype_); }

  double Get(std::size_t i) const { return LoadAsF32(data(), dtype_, i); }
  void Set(std::size_t i, double v) { StoreFromF32(data(), dtype_, i, static_cast<float>(v)); }
  std::uint16_t Bits16(std::size_t i) const { return static_cast<const std::uint16_t*>(data())[i]; }
  float F32(std::size_t i) const { return static_cast<const float*>(data())[i]; }

  std::vector<double> ToDouble() const {
    std::vector<double> out(n_);
    for (std::size_t i = 0; i < n_; ++i) out[i] = Get(i);
    return out;
  }
  bool SameBytes(const Buffer& other) const {
    return num_bytes() == other.num_bytes() && std::memcmp(data(), other.data(), num_bytes()) == 0;
  }
  bool GuardsIntact() const {
    const std::size_t end = begin_ + num_bytes();
    for (std::size_t b = 0; b < bytes_.size(); ++b) {
      if ((b < begin_ || b >= end) && bytes_[b] != kGuard) return false;
    }
    return true;
  }

 private:
  DType dtype_;
  std::size_t n_;
  std::vector<std::uint8_t> bytes_;
  std::size_t begin_;
};

// ------------------------------------------------------------------------------------------------
// Comparison helpers

std::string Num(double x) {
  std::ostringstream out;
  out.precision(9);
  out << x;
  return out.str();
}

// Bit patterns as integers ordered like the values (sign-magnitude to two's complement).
std::int64_t OrderedF32(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const std::int64_t mag = u & 0x7FFFFFFFu;
  return (u >> 31) != 0 ? -mag : mag;
}
std::int64_t Ordered16(std::uint16_t h) {
  const std::int64_t mag = h & 0x7FFFu;
  return (h >> 15) != 0 ? -mag : mag;
}

std::uint16_t Round16(double r, DType t) {
  const auto f = static_cast<float>(r);
  return t == kBF16 ? F32ToBF16(f) : F32ToF16(f);
}
double Widen16(std::uint16_t h, DType t) { return t == kBF16 ? BF16ToF32(h) : F16ToF32(h); }

// atol = atol_eps · FLT_EPSILON · max|r|, where max|r| runs over the buffer's oracle values before
// and after the step(s): `scale` carries the "before" part. A result that is small after
// cancellation (b = μb + d with |b| ≪ |μb|) is then held to the precision of its inputs, as f32
// math can deliver no more.
struct Tolerance {
  double rtol;
  double atol_eps;
  double scale = 0.0;
};

// Collects mismatches and reports the first 5 as `i, kernel, ref, ulps` plus the largest error.
class MismatchLog {
 public:
  void Add(std::size_t i, double kernel, double ref, double ulps, double error) {
    if (count_ < 5)
      lines_ << "    i=" << i << ", kernel=" << Num(kernel) << ", ref=" << Num(ref)
             << ", ulps=" << ulps << "\n";
    ++count_;
    Track(i, error);
  }
  void Track(std::size_t i, double error) {
    if (!(error <= max_error_)) {  // NaN counts as the largest
      max_error_ = error;
      max_index_ = i;
    }
  }
  bool ok() const { return count_ == 0; }
  std::string Report(std::size_t n, const std::string& rule) const {
    std::ostringstream out;
    out << count_ << " of " << n << " elements mismatch (" << rule << "):\n"
        << lines_.str() << "    max error " << Num(max_error_) << " at i=" << max_index_ << "\n";
    return out.str();
  }

 private:
  std::size_t count_ = 0;
  std::ostringstream lines_;
  double max_error_ = 0.0;
  std::size_t max_index_ = 0;
};

double MaxAbsFinite(const std::vector<double>& r) {
  double m = 0.0;
  for (double x : r) {
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  }
  return m;
}

// f32 rule. Returns "" on success, else a report.
std::string CompareF32(const Buffer& k, const std::vector<double>& r, const Tolerance& tol) {
  const double atol = tol.atol_eps * FLT_EPSILON * std::max(tol.scale, MaxAbsFinite(r));
  MismatchLog log;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double kv = k.F32(i);
    const double err = std::abs(kv - r[i]);
    bool ok;
    if (std::isnan(r[i])) {
      ok = std::isnan(kv);
    } else if (std::isinf(r[i])) {
      ok = kv == r[i];
    } else {
      ok = err <= std::max(tol.rtol * std::abs(r[i]), atol);
    }
    if (ok) {
      log.Track(i, std::isfinite(r[i]) ? err : 0.0);
    } else {
      const auto ulps = static_cast<double>(
          std::abs(OrderedF32(k.F32(i)) - OrderedF32(static_cast<float>(r[i]))));
      log.Add(i, kv, r[i], ulps, err);
    }
  }
  if (log.ok()) return "";
  return log.Report(r.size(), "f32 rule, rtol " + Num(tol.rtol) + ", atol " + Num(atol));
}

// 16-bit rule: ≤ 1 ulp of the storage type from the rounded oracle value (or within the f32 atol),
// NaN iff NaN; plus the bias check on ≥ 4096 elements.
std::string Compare16(const Buffer& k, const std::vector<double>& r, const Tolerance& tol) {
  const DType t = k.dtype();
  const double atol = tol.atol_eps * FLT_EPSILON * std::max(tol.scale, MaxAbsFinite(r));
  MismatchLog log;
  double bias_sum = 0.0;
  std::size_t bias_n = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const std::uint16_t kb = k.Bits16(i);
    const double kv = Widen16(kb, t);
    const std::uint16_t eb = Round16(r[i], t);
    bool ok;
    double ulps = 0.0;
    if (std::isnan(r[i])) {
      ok = std::isnan(kv);
    } else {
      ulps = std::isnan(kv) ? std::numeric_limits<double>::infinity()
                            : static_cast<double>(std::abs(Ordered16(kb) - Ordered16(eb)));
      ok = ulps <= 1.0 || std::abs(kv - r[i]) <= atol;
    }
    if (ok) {
      log.Track(i, ulps);
    } else {
      log.Add(i, kv, r[i], ulps, ulps);
    }
    if (std::isfinite(r[i]) && std::isfinite(kv) && r[i] != 0.0 && ulps <= 1.0) {
      // Signed distance from the correctly rounded oracle value, in ulps, positive away from zero.
      // (Elements that passed only by the atol floor are left out: there the f32 math dominates.)
      bias_sum += static_cast<double>(Ordered16(kb) - Ordered16(eb)) * (r[i] < 0 ? -1.0 : 1.0);
      ++bias_n;
    }
  }
  std::string out;
  if (!log.ok()) out = log.Report(r.size(), "<= 1 ulp of " + std::string(DTypeName(t)));
  if (r.size() >= 4096 && bias_n > 0) {
    const double bias = bias_sum / static_cast<double>(bias_n);
    if (!(std::abs(bias) < 0.25)) {
      out += "  bias: mean signed error " + Num(bias) + " ulp of " + std::string(DTypeName(t)) +
             " (vs the rounded oracle, positive away from zero) over " + std::to_string(bias_n) +
             " elements; must be < 0.25, truncation gives about -0.5\n";
    }
  }
  return out;
}

std::string CompareBuffer(const Buffer& k, const std::vector<double>& r, const Tolerance& tol) {
  return k.dtype() == kF32 ? CompareF32(k, r, tol) : Compare16(k, r, tol);
}

// The 16-bit param must be exactly the rounding of the kernel's own master (NaN iff NaN).
std::string CompareMasterRounding(const Buffer& param, const Buffer& master) {
  MismatchLog log;
  for (std::size_t i = 0; i < param.size(); ++i) {
    const float m = master.F32(i);
    const std::uint16_t want = param.dtype() == kBF16 ? F32ToBF16(m) : F32ToF16(m);
    const std::uint16_t got = param.Bits16(i);
    const double got_v = Widen16(got, param.dtype());
    const bool ok = std::isnan(m) ? std::isnan(got_v) : got == want;
    if (!ok) {
      log.Add(i, got_v, m, static_cast<double>(std::abs(Ordered16(got) - Ordered16(want))), 1.0);
    }
  }
  return log.ok() ? "" : log.Report(param.size(), "param == round(master)");
}

// ------------------------------------------------------------------------------------------------
// Algorithms: the public step and the descriptor's data, with the algorithm's cases.

using ref::StateSpans;

// What a test algorithm takes from its descriptor (src/algos/): the Hyper struct, torch's state
// keys, the state slots the hyper-parameters need (RequiredStates, which the golden tests hold to
// torch's state), the public step, and a Hyper as text for the failure messages.
template <class D>
struct FromDescriptor {
  using Descriptor = D;
  using Hyper = typename D::Hyper;
  static constexpr const auto& kStateNames = D::kStates;
  static void Step(std::span<const Hyper> g, std::span<const Segment> s, Runtime& rt) {
    FusedStep(g, s, rt);
  }
  static unsigned States(const Hyper& h) { return D::RequiredStates(h); }
  static std::string Describe(const Hyper& h) {
    std::ostringstream o;
    o << D::kTorchName << "{";
    const char* sep = "";
    algos::ForEachField<D>([&](const auto& f) {
      o << sep << f.name << "=" << h.*f.member;
      sep = " ";
    });
    o << "}";
    return o.str();
  }
};

// An algorithm of the sweep: its descriptor's data and its cases (ref::KernelCases<Hyper> in
// tests/reference/<algo>.h, or a test-only algorithm's Stem##Sweep in tests/algos/). The cases
// hold
//   Ref(h, step, p, g, states)           the oracle's step of one tensor (on clipped gradients);
//   Options()                            the option sweep (KernelLarge takes its first and last);
//   OtherGroup(h)                        a second group's options beside h;
//   InitState(h, slot, step, rng)        a state element of a tensor about to take `step`;
// and where the algorithm needs them
//   InitScalars(h, step, scalars)        the per-tensor scalar states before `step`;
//   Rows(n)                              the channel rows of a segment of n elements;
//   Start(h, i, step, p, states, rng)    element i's param and states made consistent (signs,
//                                        cross-state invariants of a real run);
//   Grad(kind, i, rng, default_grad)     element i's gradient of a kind, if not default_grad();
//   ScaleGrads(groups, segs, grads)      clipping across segments, on the oracle's gradients;
//   TargetRuns()                         the DeterminismAcrossTargets runs.
template <class D, class Cases>
struct Algo : FromDescriptor<D>, Cases {
  using Hyper = typename D::Hyper;
};

// The algorithms that run the generic sweep: those whose cases have the oracle of a flat tensor.
template <class Cases>
concept FlatCases = requires {
  &Cases::Ref;
};

// ------------------------------------------------------------------------------------------------
// Test cases: segments with their buffers, the oracle's copy, and one driver

enum class GradKind { kRandom, kZero, kHuge, kTiny, kNonFinite };

const char* GradKindName(GradKind k) {
  switch (k) {
    case GradKind::kRandom:
      return "random";
    case GradKind::kZero:
      return "zero";
    case GradKind::kHuge:
      return "huge (1e4)";
    case GradKind::kTiny:
      return "tiny (1e-12, eps-dominated)";
    case GradKind::kNonFinite:
      return "random with NaN/+Inf/-Inf";
  }
  return "?";
}

struct SegSpec {
  std::size_t n;
  Combo combo;
  std::uint32_t group = 0;
  std::int64_t first_step = 1;
  bool unaligned = false;
};

// One segment's buffers, plus the oracle's running copy of param and state.
struct SegData {
  SegSpec spec;
  std::int64_t step;
  Buffer param;
  Buffer grad;
  std::optional<Buffer> master;
  std::array<std::optional<Buffer>, kMaxStates> state;
  // Segment::scalars (per-tensor scalar states), advanced by the step itself.
  std::array<float, kMaxScalars> scalars{};
  std::size_t rows = 0;  // Segment::rows (channel rows, where the cases give Rows)
  // True when every persistent buffer is f32: the oracle then runs free for all steps.
  bool free_running;
  std::vector<double> ref_p;
  std::array<std::vector<double>, kMaxStates> ref_state;
  // Largest finite |value| the oracle has seen per buffer (param, then states): Tolerance::scale.
  std::array<double, 1 + kMaxStates> ref_scale{};

  Segment ToSegment() {
    Segment s;
    s.param = param.data();
    s.grad = grad.data();
    for (int k = 0; k < kMaxStates; ++k) {
      if (state[k]) s.state[k] = state[k]->data();
    }
    s.master = master ? static_cast<float*>(master->data()) : nullptr;
    for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &scalars[k];
    s.numel = spec.n;
    s.rows = rows;
    s.param_dtype = spec.combo.param;
    s.grad_dtype = spec.combo.grad;
    s.state_dtype = spec.combo.state;
    s.group = spec.group;
    s.step = step;
    return s;
  }
  // Loads the oracle's copy from the kernel's buffers (the master stands for the param when
  // present).
  void SyncOracle() {
    ref_p = master ? master->ToDouble() : param.ToDouble();
    for (int k = 0; k < kMaxStates; ++k)
      ref_state[k] = state[k] ? state[k]->ToDouble() : std::vector<double>{};
  }
  void TrackScale() {
    ref_scale[0] = std::max(ref_scale[0], MaxAbsFinite(ref_p));
    for (int k = 0; k < kMaxStates; ++k) {
      ref_scale[1 + k] = std::max(ref_scale[1 + k], MaxAbsFinite(ref_state[k]));
    }
  }
};

template <class A>
SegData MakeSegment(const SegSpec& spec, const typename A::Hyper& h, Rng& rng) {
  const Combo& c = spec.combo;
  SegData s{.spec = spec,
            .step = spec.first_step,
            .param = Buffer(c.param, spec.n, spec.unaligned),
            .grad = Buffer(c.grad, spec.n, spec.unaligned),
            .master = std::nullopt,
            .state = {},
            .free_running = (c.param == kF32 || c.master) && c.state == kF32,
            .ref_p = {},
            .ref_state = {},
            .ref_scale = {}};
  if (c.master) {
    s.master.emplace(kF32, spec.n, spec.unaligned);
    for (std::size_t i = 0; i < spec.n; ++i) {
      s.master->Set(i, rng.Uniform(-1.0, 1.0));
      s.param.Set(i, s.master->Get(i));
    }
  } else {
    for (std::size_t i = 0; i < spec.n; ++i) s.param.Set(i, rng.Uniform(-1.0, 1.0));
  }
  if constexpr (requires { A::InitScalars; }) A::InitScalars(h, spec.first_step, s.scalars);
  if constexpr (requires { A::Rows(spec.n); }) s.rows = A::Rows(spec.n);
  const unsigned states = A::States(h);
  for (int k = 0; k < kMaxStates; ++k) {
    if ((states >> k & 1u) == 0) continue;
    s.state[k].emplace(c.state, spec.n, spec.unaligned);
    for (std::size_t i = 0; i < spec.n; ++i)
      s.state[k]->Set(i, A::InitState(h, k, spec.first_step, rng));
  }
  if constexpr (requires { &A::template Start<Rng>; }) {
    for (std::size_t i = 0; i < spec.n; ++i) {
      double p = s.master ? s.master->Get(i) : s.param.Get(i);
      std::array<double, kMaxStates> st{};
      for (int k = 0; k < kMaxStates; ++k) {
        if (s.state[k]) st[k] = s.state[k]->Get(i);
      }
      A::Start(h, i, spec.first_step, p, st, rng);
      if (s.master) {
        s.master->Set(i, p);
        s.param.Set(i, s.master->Get(i));
      } else {
        s.param.Set(i, p);
      }
      for (int k = 0; k < kMaxStates; ++k) {
        if (s.state[k]) s.state[k]->Set(i, st[k]);
      }
    }
  }
  s.SyncOracle();
  return s;
}

double DefaultGrad(GradKind kind, Rng& rng) {
  switch (kind) {
    case GradKind::kRandom:
    case GradKind::kNonFinite:
      // |g| >= 0.2 keeps g + λθ away from 0: near |g| ~ eps the first steps of the adaptive
      // methods compute g / (|g| + eps), which amplifies f32 rounding of g + λθ without bound.
      // Zero and tiny gradients have their own cases.
      return rng.Uniform(0.2, 1.0) * (rng.Next() & 1 ? 1.0 : -1.0);
    case GradKind::kZero:
      return 0.0;
    case GradKind::kHuge:
      return rng.Uniform(0.5, 1.0) * (rng.Next() & 1 ? 1e4 : -1e4);
    case GradKind::kTiny:
      return rng.Uniform(-1.0, 1.0) * 1e-12;
  }
  return 0.0;
}

template <class A>
void FillGrads(SegData& s, GradKind kind, Rng& rng) {
  for (std::size_t i = 0; i < s.spec.n; ++i) {
    const auto default_grad = [&] { return DefaultGrad(kind, rng); };
    if constexpr (requires { A::Grad(kind, i, rng, default_grad); }) {
      s.grad.Set(i, A::Grad(kind, i, rng, default_grad));
    } else {
      s.grad.Set(i, default_grad());
    }
  }
  if (kind == GradKind::kNonFinite) {
    const double special[] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY};
    for (std::size_t j = 0; j < 3; ++j) {
      if (3 + 2 * j < s.spec.n) s.grad.Set(3 + 2 * j, special[j]);
    }
  }
}

template <class A>
struct Case {
  std::vector<typename A::Hyper> groups;
  std::vector<SegSpec> segs;
  int steps = 1;
  int threads = 1;
  GradKind grads = GradKind::kRandom;
  std::uint64_t seed = 1;
};

template <class A>
std::string DescribeCase(const Case<A>& c, const std::string& target) {
  std::ostringstream o;
  o << "target " << target << ", " << c.steps << " step(s), Runtime(" << c.threads << "), grads "
    << GradKindName(c.grads) << ", seed " << c.seed << "\n  groups:";
  for (std::size_t g = 0; g < c.groups.size(); ++g)
    o << "\n    [" << g << "] " << A::Describe(c.groups[g]);
  return o.str();
}

std::string DescribeSeg(std::size_t index, const SegData& s) {
  std::ostringstream o;
  o << "segment " << index << " (n=" << s.spec.n << ", " << ComboName(s.spec.combo) << ", group "
    << s.spec.group << ", step " << s.step << (s.spec.unaligned ? ", unaligned" : ", aligned")
    << (s.free_running ? ", free-running oracle" : ", oracle re-synced every step") << ")";
  return o.str();
}

// Compares one segment with the oracle; returns "" or a report.
template <class A>
std::string CheckSegment(const SegData& s, const Tolerance& tol) {
  std::string out;
  const auto check = [&](const char* name, const Buffer& k, const std::vector<double>& r,
                         double scale) {
    const std::string e = CompareBuffer(k, r, {tol.rtol, tol.atol_eps, scale});
    if (!e.empty()) out += std::string("  buffer ") + name + ": " + e;
  };
  if (s.master) {
    check("master", *s.master, s.ref_p, s.ref_scale[0]);
    const std::string e = CompareMasterRounding(s.param, *s.master);
    if (!e.empty()) out += "  buffer param: " + e;
  } else {
    check("param", s.param, s.ref_p, s.ref_scale[0]);
  }
  for (int k = 0; k < kMaxStates; ++k) {
    if (s.state[k]) check(A::kStateNames[k], *s.state[k], s.ref_state[k], s.ref_scale[1 + k]);
  }
  return out;
}

// Runs a case against the oracle; reports the first failing step and returns false on failure.
template <class A>
bool RunCase(const Case<A>& c, const std::string& target) {
  Rng rng(c.seed);
  std::vector<SegData> segs;
  segs.reserve(c.segs.size());
  for (const SegSpec& spec : c.segs)
    segs.push_back(MakeSegment<A>(spec, c.groups[spec.group], rng));
  Runtime runtime(c.threads);
  const double widen = IsFmaTarget(target) ? 1.0 : 10.0;
  for (int t = 0; t < c.steps; ++t) {
    std::vector<Segment> table;
    std::vector<Buffer> grad_copies;
    std::vector<std::vector<double>> grads;
    for (SegData& s : segs) {
      FillGrads<A>(s, c.grads, rng);
      grad_copies.push_back(s.grad);
      if (!s.free_running) s.SyncOracle();
      s.TrackScale();
      grads.push_back(s.grad.ToDouble());
    }
    // Clipping across segments (per (group, dtype) norms) scales the oracle's gradients.
    if constexpr (requires { A::ScaleGrads(std::span(c.groups), segs, grads); }) {
      A::ScaleGrads(std::span(c.groups), segs, grads);
    }
    for (std::size_t i = 0; i < segs.size(); ++i) {
      SegData& s = segs[i];
      StateSpans st;
      for (int k = 0; k < kMaxStates; ++k) st[k] = s.ref_state[k];
      A::Ref(c.groups[s.spec.group], s.step, s.ref_p, grads[i], st);
      table.push_back(s.ToSegment());
    }
    A::Step(c.groups, table, runtime);

    std::string failures;
    const bool last = t + 1 == c.steps;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      SegData& s = segs[i];
      std::string e;
      if (!s.grad.SameBytes(grad_copies[i])) e += "  the gradient was modified\n";
      if (!s.free_running || last) {
        // Free-running buffers have accumulated c.steps steps of error; re-synced ones one step.
        const bool many = s.free_running && c.steps > 1;
        const Tolerance tol{(many ? 1e-5 : 2e-6) * widen, 8.0 * widen};
        e += CheckSegment<A>(s, tol);
      }
      if (!e.empty())
        failures += DescribeSeg(i, s) + " after step " + std::to_string(t + 1) + ":\n" + e;
      ++s.step;
    }
    if (!failures.empty()) {
      ADD_FAILURE() << DescribeCase(c, target) << "\n" << failures;
      return false;
    }
  }
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const SegData& s = segs[i];
    bool intact =
        s.param.GuardsIntact() && s.grad.GuardsIntact() && (!s.master || s.master->GuardsIntact());
    for (const auto& b : s.state) intact = intact && (!b || b->GuardsIntact());
    if (!intact) {
      ADD_FAILURE() << DescribeCase(c, target) << "\n"
                    << DescribeSeg(i, segs[i])
                    << ": bytes outside the segment's buffers were written";
      return false;
    }
  }
  return true;
}

// Stops a sweep after this many failing cases, to keep the output readable.
constexpr int kMaxFailingCases = 3;

// ------------------------------------------------------------------------------------------------
// KernelSweep: options × combos × offset × {1, 20} steps; sizes {0,1,7,8,9,63,64,65} as segments of
// one call, alternating between two groups and starting at steps 1, 7 and 2.

template <class A>
void RunSweep(const std::string& target) {
  const std::size_t sizes[] = {0, 1, 7, 8, 9, 63, 64, 65};
  const std::int64_t first_steps[] = {1, 7, 1, 2};
  // FOPT_TEST_SMALL (sanitizer runs): the long run is 3 steps, not 20. Every option set, combo,
  // size and offset still runs, and each step touches the same memory as the one before: the 17
  // repeats were more than half of the asan run's time.
  const int long_run = SmallOnly() ? 3 : 20;
  int failing = 0;
  std::uint64_t seed = 1;
  for (const typename A::Hyper& h : A::Options()) {
    for (const Combo& combo : AllCombos()) {
      for (bool unaligned : {false, true}) {
        for (int steps : {1, long_run}) {
          Case<A> c;
          c.groups = {h, A::OtherGroup(h)};
          for (std::size_t i = 0; i < std::size(sizes); ++i) {
            c.segs.push_back({.n = sizes[i],
                              .combo = combo,
                              .group = static_cast<std::uint32_t>(i % 2),
                              .first_step = first_steps[i % std::size(first_steps)],
                              .unaligned = unaligned});
          }
          c.steps = steps;
          c.threads = unaligned ? 2 : 1;
          c.seed = seed++;
          if (!RunCase(c, target) && ++failing >= kMaxFailingCases) return;
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// KernelMixed: every option combination is its own group, with one segment each; the segments cycle
// through all dtype combos, several sizes, offsets and step counts, all in one call per step.

template <class A>
void RunMixed(const std::string& target) {
  const std::size_t sizes[] = {65, 1, 9, 64, 0, 7, 63, 8};
  const std::int64_t first_steps[] = {1, 7, 2, 1, 4};
  const std::vector<Combo> combos = AllCombos();
  Case<A> c;
  c.groups = A::Options();
  for (std::size_t i = 0; i < c.groups.size() + combos.size(); ++i) {
    c.segs.push_back({.n = sizes[i % std::size(sizes)],
                      .combo = combos[i % combos.size()],
                      .group = static_cast<std::uint32_t>(i % c.groups.size()),
                      .first_step = first_steps[i % std::size(first_steps)],
                      .unaligned = i % 3 == 1});
  }
  for (int threads : {1, 2}) {
    c.steps = 20;
    c.threads = threads;
    c.seed = 1000 + static_cast<std::uint64_t>(threads);
    if (!RunCase(c, target)) return;
  }
}

// ------------------------------------------------------------------------------------------------
// KernelLarge: 4099 elements on every 16-bit combo (so the bias check runs), and 1000003 elements
// on f32/f32/f32 and bf16/bf16/bf16, with Runtime(2). Fresh state (step 1) then a second step, so
// that the 16-bit results are well-spread roundings and the bias check is meaningful.

template <class A>
void RunLarge(const std::string& target) {
  const std::vector<typename A::Hyper> options = A::Options();
  for (const typename A::Hyper& h : {options.front(), options.back()}) {
    for (const Combo& combo : AllCombos()) {
      if (combo.param == kF32 && combo.grad == kF32 && combo.state == kF32) continue;
      Case<A> c;
      c.groups = {h};
      c.segs = {{.n = 4099, .combo = combo, .unaligned = true}};
      c.steps = 2;
      c.threads = 2;
      c.seed = 7;
      if (!RunCase(c, target)) return;
    }
  }
  if (SmallOnly()) return;
  for (const Combo& combo : {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16}}) {
    Case<A> c;
    c.groups = {options.back()};
    c.segs = {{.n = 1000003, .combo = combo, .unaligned = true}};
    c.steps = 2;
    c.threads = 2;
    c.seed = 11;
    if (!RunCase(c, target)) return;
  }
}

// ------------------------------------------------------------------------------------------------
// KernelSpecial: zero, huge, eps-dominated and NaN/Inf gradients against the oracle (NaN/Inf must
// reach exactly the elements they touch); zero-size segments are no-ops.

template <class A>
void RunSpecialValues(const std::string& target) {
  int failing = 0;
  for (GradKind kind : {GradKind::kZero, GradKind::kHuge, GradKind::kTiny, GradKind::kNonFinite}) {
    for (const typename A::Hyper& h : A::Options()) {
      for (const Combo& combo : {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16},
                                 Combo{kF16, kF16, kF32, /*master=*/true}}) {
        Case<A> c;
        c.groups = {h};
        // Fresh tensors only: later-step random states would not be eps-dominated.
        c.segs = {{.n = 65, .combo = combo}, {.n = 9, .combo = combo, .unaligned = true}};
        c.steps = 3;
        c.grads = kind;
        if (!RunCase(c, target) && ++failing >= kMaxFailingCases) return;
      }
    }
  }
}

// Zero-size segments, with null or with non-null pointers into guarded memory, among real ones and
// alone.
template <class A>
void RunZeroSize(const std::string& target) {
  const typename A::Hyper h = A::Options().back();
  const unsigned states = A::States(h);
  Rng rng(3);
  SegData real = MakeSegment<A>({.n = 9, .combo = {kBF16, kBF16, kF32, true}}, h, rng);
  FillGrads<A>(real, GradKind::kRandom, rng);
  Buffer canary(kF32, 0, false);
  Segment null_seg;  // numel 0, all pointers null (but the scalar states an algorithm keeps)
  null_seg.step = 1;
  Segment pointing = null_seg;  // numel 0, pointers into guarded memory
  pointing.param = canary.data();
  pointing.grad = canary.data();
  for (int k = 0; k < kMaxStates; ++k) {
    if ((states >> k & 1u) != 0) pointing.state[k] = canary.data();
  }
  pointing.step = 5;
  // Scalar states of an empty tensor still advance (torch's mu_product does): one slot each.
  std::array<std::array<float, kMaxScalars>, 5> scalar_slots{};
  const auto with_scalars = [&](Segment seg, std::size_t slot) {
    for (int k = 0; k < kMaxScalars; ++k) seg.scalars[k] = &scalar_slots[slot][k];
    return seg;
  };

  Runtime runtime(2);
  SCOPED_TRACE("target " + target + ", " + A::Describe(h));
  const std::vector<typename A::Hyper> groups = {h};
  // Only empty segments, then no segments and no groups at all.
  const std::vector<Segment> empties = {with_scalars(null_seg, 0), with_scalars(pointing, 1),
                                        with_scalars(null_seg, 2)};
  EXPECT_NO_THROW(A::Step(groups, empties, runtime));
  EXPECT_NO_THROW(A::Step({}, {}, runtime));
  EXPECT_TRUE(canary.GuardsIntact());

  // Empty segments around a real one: the real one matches the oracle, the empty ones are
  // untouched.
  StateSpans st;
  for (int k = 0; k < kMaxStates; ++k) st[k] = real.ref_state[k];
  std::vector<std::vector<double>> g = {real.grad.ToDouble()};
  real.TrackScale();
  if constexpr (requires { A::ScaleGrads(std::span(groups), std::vector<SegData>{}, g); }) {
    A::ScaleGrads(std::span(groups), std::vector<SegData>{real}, g);  // the empty ones add nothing
  }
  A::Ref(h, real.step, real.ref_p, g[0], st);
  const std::vector<Segment> table = {with_scalars(null_seg, 0), with_scalars(pointing, 1),
                                      real.ToSegment(), with_scalars(null_seg, 2),
                                      with_scalars(pointing, 3)};
  EXPECT_NO_THROW(A::Step(groups, table, runtime));
  EXPECT_TRUE(canary.GuardsIntact());
  const double widen = IsFmaTarget(target) ? 1.0 : 10.0;
  EXPECT_EQ(CheckSegment<A>(real, {2e-6 * widen, 8.0 * widen}), "");
}

// ------------------------------------------------------------------------------------------------
// Determinism: Runtime(1), Runtime(2) and Runtime(3) give bit-identical buffers over several
// chunks and segments.

// The workload: segments of 143342 elements in all (5 chunks) in two groups, fresh or at step 4.
constexpr std::size_t kDeterminismSizes[] = {40000, 0, 1, 70001, 33333, 7};

template <class A>
std::vector<SegData> DeterminismSegments(const std::vector<typename A::Hyper>& groups,
                                         const Combo& combo) {
  Rng rng(42);
  std::vector<SegData> out;
  for (std::size_t i = 0; i < std::size(kDeterminismSizes); ++i) {
    const SegSpec spec{.n = kDeterminismSizes[i],
                       .combo = combo,
                       .group = static_cast<std::uint32_t>(i % 2),
                       .first_step = i % 3 == 0 ? 1 : 4,
                       .unaligned = i % 2 == 1};
    out.push_back(MakeSegment<A>(spec, groups[spec.group], rng));
  }
  return out;
}

// Step t (0-based) of the workload: the same gradients for the same t, then one call.
template <class A>
void DeterminismStep(std::vector<SegData>& segs, const std::vector<typename A::Hyper>& groups,
                     int t, int threads) {
  Rng rng(100 + static_cast<std::uint64_t>(t));
  std::vector<Segment> table;
  for (SegData& s : segs) {
    FillGrads<A>(s, GradKind::kRandom, rng);
    table.push_back(s.ToSegment());
    ++s.step;
  }
  Runtime runtime(threads);
  A::Step(groups, table, runtime);
}

// "" if every buffer of a and b holds the same bytes, else the first that does not.
template <class A>
std::string FirstDifference(const std::vector<SegData>& a, const std::vector<SegData>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string seg =
        "segment " + std::to_string(i) + " (n=" + std::to_string(a[i].spec.n) + "): ";
    if (!a[i].param.SameBytes(b[i].param)) return seg + "param differs";
    if (a[i].master && !a[i].master->SameBytes(*b[i].master)) return seg + "master differs";
    for (int k = 0; k < kMaxStates; ++k) {
      if (a[i].state[k] && !a[i].state[k]->SameBytes(*b[i].state[k]))
        return seg + A::kStateNames[k] + " differs";
    }
  }
  return "";
}

template <class A>
void RunDeterminism(const std::string& target) {
  const std::vector<typename A::Hyper> options = A::Options();
  // FOPT_TEST_SMALL (sanitizer runs): one option set and two combos, still over 5 chunks.
  std::vector<typename A::Hyper> hypers = {options.back()};
  std::vector<Combo> combos = {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16}};
  if (!SmallOnly()) {
    hypers.push_back(options.front());
    combos.push_back(Combo{kF16, kF16, kF32, true});
  }
  constexpr int kThreads[] = {1, 2, 3};
  for (const typename A::Hyper& h : hypers) {
    const std::vector<typename A::Hyper> groups = {h, A::OtherGroup(h)};
    for (const Combo& combo : combos) {
      std::array<std::vector<SegData>, std::size(kThreads)> runs;
      for (auto& run : runs) run = DeterminismSegments<A>(groups, combo);
      for (int t = 0; t < 3; ++t) {
        for (std::size_t r = 0; r < std::size(kThreads); ++r) {
          DeterminismStep<A>(runs[r], groups, t, kThreads[r]);
        }
        for (std::size_t r = 1; r < runs.size(); ++r) {
          ASSERT_EQ(FirstDifference<A>(runs[0], runs[r]), "")
              << "target " << target << ", " << A::Describe(h) << ", " << ComboName(combo)
              << ", step " << t + 1 << ": Runtime(" << kThreads[0] << ") vs Runtime(" << kThreads[r]
              << ")";
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// DeterminismAcrossTargets: the determinism workload on every available target (with 1, 2 or 3
// threads in turn). Targets of one class (FMA: AVX2 and up; non-FMA: SSE4 and SSSE3 where built,
// SCALAR) must agree bit for bit whatever their vector width: per-tensor norms are reduced in a
// fixed order of 16 accumulators, never per lane. Between the classes only MulAdd rounds
// differently, so inputs where every MulAdd is exact must agree on every target
// (all_targets_agree; the cases say why theirs are exact).

template <class A>
void RunAcrossTargets(const std::vector<std::vector<typename A::Hyper>>& group_sets,
                      const std::vector<Combo>& combos, bool all_targets_agree) {
  test::TargetGuard guard;
  const std::vector<std::string> targets = test::KernelTargets();
  for (const auto& groups : group_sets) {
    for (const Combo& combo : combos) {
      // The first target of each class and its result.
      std::optional<std::pair<std::string, std::vector<SegData>>> first[2];
      for (std::size_t ti = 0; ti < targets.size(); ++ti) {
        ForceTarget(targets[ti]);
        ASSERT_EQ(ActiveTargetName(), targets[ti]);
        const int threads = static_cast<int>(ti % 3) + 1;
        std::vector<SegData> run = DeterminismSegments<A>(groups, combo);
        for (int t = 0; t < 3; ++t) DeterminismStep<A>(run, groups, t, threads);
        auto& baseline = first[all_targets_agree || IsFmaTarget(targets[ti]) ? 1 : 0];
        if (!baseline) {
          baseline.emplace(targets[ti], std::move(run));
          continue;
        }
        EXPECT_EQ(FirstDifference<A>(baseline->second, run), "")
            << A::Describe(groups[0]) << " / " << A::Describe(groups[1]) << ", " << ComboName(combo)
            << ", after 3 steps: target " << targets[ti] << " (Runtime(" << threads << ")) vs "
            << baseline->first;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The shaped sweep: states factored over a tensor's matrices (the descriptor's kStateShapes and
// SegmentStates: a row state of batch·rows values, a column state of batch·cols, or the param's
// shape) do not fit the flat sweep's param-shaped buffers. An algorithm whose cases have the oracle
// of such a tensor (ShapedCases) runs this sweep instead, from its cases:
//   ShapedRef(h, step, rows, cols, p, g, states)  the oracle of one tensor of row-major rows × cols
//                                                 matrices (rows = cols = 0: a vector);
//   Options(), OtherGroup(h)                      as the flat sweep's;
//   Shapes()                                      {rows, cols, numel} of the sweep's tensors, every
//                                                 shape kind in one call of two groups;
//   DeterminismGroups(), DeterminismShapes()      the determinism workload, of many tiles.
// KernelSweep.Stem checks each call against the oracle, Determinism.Stem and
// DeterminismAcrossTargets.Stem compare the workload's bits.

template <class A>
concept ShapedCases = !FlatCases<A> && requires {
  &A::ShapedRef;
};

using TensorShape = std::array<std::size_t, 3>;  // rows, cols, numel

// One segment of the shaped sweep: its buffers and the oracle's copy.
template <class A>
struct ShapedSegment {
  using D = typename A::Descriptor;
  std::size_t rows, cols, numel;
  std::uint32_t group = 0;
  std::int64_t step = 1;  // of the next call
  unsigned used = 0;      // the state slots of this shape
  Buffer param, grad;
  std::vector<Buffer> state;  // every slot, empty where unused
  std::optional<Buffer> master;
  std::vector<double> p, g;  // the oracle's
  std::array<std::vector<double>, kMaxStates> st;

  ShapedSegment(const TensorShape& shape, const Combo& c, std::uint32_t grp, std::int64_t first,
                bool unaligned, Rng& rng)
      : rows(shape[0]),
        cols(shape[1]),
        numel(shape[2]),
        group(grp),
        step(first),
        param(c.param, numel, unaligned),
        grad(c.grad, numel, unaligned) {
    Segment s;
    s.numel = numel;
    s.rows = rows;
    s.cols = cols;
    used = D::SegmentStates(s);
    const std::size_t batch = rows == 0 ? 0 : numel / (rows * cols);
    for (int k = 0; k < kMaxStates; ++k) {
      std::size_t n = 0;
      if ((used >> k & 1u) != 0) {
        const algos::Shape shape_k = D::kStateShapes[k];
        n = shape_k == algos::Shape::kRows   ? batch * rows
            : shape_k == algos::Shape::kCols ? batch * cols
                                             : numel;
      }
      state.emplace_back(c.state, n, unaligned);
    }
    if (c.master) master.emplace(kF32, numel, unaligned);
    for (std::size_t i = 0; i < numel; ++i) {
      const double x = rng.Uniform(-1.0, 1.0);
      if (master) {
        master->Set(i, x);
        param.Set(i, master->F32(i));
      } else {
        param.Set(i, x);
      }
    }
    p = master ? master->ToDouble() : param.ToDouble();
    // Nonzero states after the first step: squares' running means around g², some far below it (so
    // that RMS(U) > d and the update is clipped).
    for (int k = 0; k < kMaxStates; ++k) {
      for (std::size_t i = 0; i < state[k].size(); ++i) {
        state[k].Set(i, first == 1 ? 0.0 : rng.Uniform(1e-4, 0.02));
      }
      st[k] = state[k].ToDouble();
    }
  }

  void NewGrad(Rng& rng, double scale) {
    for (std::size_t i = 0; i < numel; ++i) grad.Set(i, rng.Uniform(-scale, scale));
    g = grad.ToDouble();
  }
  Segment MakeSegment(const Combo& c) {
    Segment s;
    s.param = param.data();
    s.grad = grad.data();
    s.master = master ? static_cast<float*>(master->data()) : nullptr;
    for (int k = 0; k < kMaxStates; ++k) {
      if ((used >> k & 1u) != 0) s.state[k] = state[k].data();
    }
    s.numel = numel;
    s.rows = rows;
    s.cols = cols;
    s.param_dtype = c.param;
    s.grad_dtype = c.grad;
    s.state_dtype = c.state;
    s.group = group;
    s.step = step;
    return s;
  }
  void OracleStep(const typename A::Hyper& h) {
    StateSpans spans;
    for (int k = 0; k < kMaxStates; ++k) spans[k] = st[k];
    A::ShapedRef(h, step, rows, cols, p, g, spans);
  }
  // The oracle restarts from the kernel's (rounded) buffers: the per-step check of 16-bit storage.
  void SyncOracle() {
    p = master ? master->ToDouble() : param.ToDouble();
    for (int k = 0; k < kMaxStates; ++k) st[k] = state[k].ToDouble();
  }
};

// |k − r| ≤ rtol·|r| + atol·max|r| + floor over a buffer; "" when it holds.
std::string CompareShaped(const std::string& what, const std::vector<double>& k,
                          const std::vector<double>& r, double rtol, double atol,
                          double floor = 0.0) {
  double scale = 0.0;
  for (const double x : r) scale = std::max(scale, std::abs(x));
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (!(std::abs(k[i] - r[i]) <= rtol * std::abs(r[i]) + atol * scale + floor)) {
      return what + "[" + std::to_string(i) + "]: kernel " + Num(k[i]) + ", oracle " + Num(r[i]) +
             " (of " + std::to_string(r.size()) + ")";
    }
  }
  return "";
}

// Runs `steps` calls over every shape (two groups, alternating; different step counts), checking
// each against the oracle: f32 storage free running over all steps, 16-bit storage per step.
template <class A>
void RunShapedCase(const std::vector<typename A::Hyper>& groups, const Combo& c, int steps,
                   int threads, bool unaligned, bool fma) {
  Rng rng(2026);
  std::vector<ShapedSegment<A>> cases;
  const std::vector<TensorShape> shapes = A::Shapes();
  cases.reserve(shapes.size());
  std::uint32_t k = 0;
  for (const TensorShape& sh : shapes) {
    cases.emplace_back(sh, c, k % 2, k % 3 == 0 ? 1 : 4 + k, unaligned, rng);
    ++k;
  }
  const bool exact_storage = (c.param == kF32 || c.master) && c.state == kF32;
  const double widen = fma ? 1.0 : 10.0;
  Runtime runtime(threads);
  for (int step = 0; step < steps; ++step) {
    std::vector<Segment> segments;
    for (ShapedSegment<A>& a : cases) {
      a.NewGrad(rng, step % 2 == 0 ? 1.0 : 1e-3);
      if (!exact_storage) a.SyncOracle();
      segments.push_back(a.MakeSegment(c));
    }
    A::Step(groups, segments, runtime);
    for (ShapedSegment<A>& a : cases) {
      a.OracleStep(groups[a.group]);
      ++a.step;
      // f32 storage: the norms and factors round to f32 along the way (rtol over a few steps);
      // 16-bit storage: two ulps of the type.
      const double rtol16 = c.state == kBF16 || c.param == kBF16 ? 1.6e-2 : 2e-3;
      const double rtol_p = (exact_storage || c.master ? 2e-5 : rtol16) * widen;
      const double rtol_s = (c.state == kF32 ? 2e-5 : rtol16) * widen;
      const std::string where = A::Describe(groups[a.group]) + ", " + ComboName(c) + ", shape " +
                                std::to_string(a.rows) + "x" + std::to_string(a.cols) + " numel " +
                                std::to_string(a.numel) + ", call " + std::to_string(step);
      const std::vector<double> kp = a.master ? a.master->ToDouble() : a.param.ToDouble();
      EXPECT_EQ(CompareShaped("param", kp, a.p, rtol_p, 8 * FLT_EPSILON * widen), "") << where;
      // f16 states of tiny gradients are subnormal: half their spacing (2^-25) absolute
      const double floor = c.state == kF16 ? 0x1p-25 : 0.0;
      for (int s = 0; s < kMaxStates; ++s) {
        EXPECT_EQ(
            CompareShaped(A::kStateNames[s], a.state[s].ToDouble(), a.st[s], rtol_s, 0.0, floor),
            "")
            << where;
      }
      if (a.master) {  // the 16-bit param is the rounding of the master
        for (std::size_t i = 0; i < a.numel; ++i) {
          ASSERT_EQ(a.param.Get(i),
                    static_cast<double>(c.param == kBF16 ? BF16ToF32(F32ToBF16(a.master->F32(i)))
                                                         : F16ToF32(F32ToF16(a.master->F32(i)))))
              << where << " element " << i;
        }
      }
      ASSERT_TRUE(a.param.GuardsIntact()) << where;
      ASSERT_TRUE(a.grad.GuardsIntact()) << where;
      for (const Buffer& b : a.state) ASSERT_TRUE(b.GuardsIntact()) << where;
    }
  }
}

template <class A>
void RunShapedSweep(const std::string& target) {
  const std::vector<Combo> combos = {
      Combo{kF32, kF32, kF32},  Combo{kBF16, kBF16, kBF16},      Combo{kF16, kF16, kF32},
      Combo{kF32, kF32, kBF16}, Combo{kBF16, kBF16, kF32, true}, Combo{kF16, kF32, kF16, true}};
  const int steps = SmallOnly() ? 2 : 4;
  for (const typename A::Hyper& h : A::Options()) {
    for (const Combo& c : combos) {
      for (const int threads : {1, 3}) {
        RunShapedCase<A>({h, A::OtherGroup(h)}, c, steps, threads, threads == 3,
                         IsFmaTarget(target));
      }
    }
  }
}

// The determinism workload after 3 calls with Runtime(threads): every buffer's bytes.
template <class A>
std::vector<std::vector<std::uint8_t>> ShapedRun(int threads, const Combo& c) {
  Rng rng(99);
  const std::vector<typename A::Hyper> groups = A::DeterminismGroups();
  const std::vector<TensorShape> shapes = A::DeterminismShapes();
  std::vector<ShapedSegment<A>> cases;
  cases.reserve(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    cases.emplace_back(shapes[i], c, static_cast<std::uint32_t>(i % 2), 1, false, rng);
  }
  Runtime runtime(threads);
  for (int step = 0; step < 3; ++step) {
    std::vector<Segment> segments;
    for (ShapedSegment<A>& a : cases) {
      a.NewGrad(rng, 1.0);
      segments.push_back(a.MakeSegment(c));
      ++a.step;
    }
    A::Step(groups, segments, runtime);
  }
  std::vector<std::vector<std::uint8_t>> out;
  const auto add = [&](const Buffer& b) {
    const auto* bytes = static_cast<const std::uint8_t*>(b.data());
    out.emplace_back(bytes, bytes + b.num_bytes());
  };
  for (ShapedSegment<A>& a : cases) {
    add(a.param);
    for (const Buffer& b : a.state) add(b);
    if (a.master) add(*a.master);
  }
  return out;
}

// Runtime(1), (2) and (3) give the same bits, over shapes of many tiles.
template <class A>
void RunShapedDeterminism(const std::string& /*target*/) {
  for (const Combo& c : {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16, true}}) {
    const auto one = ShapedRun<A>(1, c);
    EXPECT_TRUE(one == ShapedRun<A>(2, c)) << ComboName(c) << ": Runtime(2) differs from (1)";
    EXPECT_TRUE(one == ShapedRun<A>(3, c)) << ComboName(c) << ": Runtime(3) differs from (1)";
  }
}

// Targets of one class (FMA: AVX2 and up; the others) give the same bits: the sums never depend on
// the vector width.
template <class A>
void RunShapedAcrossTargets() {
  test::TargetGuard guard;
  for (const Combo& c : {Combo{kF32, kF32, kF32}, Combo{kF16, kF16, kF32, true}}) {
    std::optional<std::pair<std::string, std::vector<std::vector<std::uint8_t>>>> first[2];
    const std::vector<std::string> targets = test::KernelTargets();
    for (std::size_t ti = 0; ti < targets.size(); ++ti) {
      ForceTarget(targets[ti]);
      auto run = ShapedRun<A>(static_cast<int>(ti % 3) + 1, c);
      auto& baseline = first[IsFmaTarget(targets[ti]) ? 1 : 0];
      if (!baseline) {
        baseline.emplace(targets[ti], std::move(run));
        continue;
      }
      EXPECT_TRUE(baseline->second == run)
          << ComboName(c) << ": target " << targets[ti] << " vs " << baseline->first;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The tests of every algorithm of the registry's list (FOPT_FOR_EACH_ALGORITHM) and of the
// test-only list (tests/algos/registry.h), named as TEST_P would name them:
// Targets/KernelSweep.Stem/TARGET, Targets/KernelMixed.Stem, Targets/KernelLarge.Stem,
// Targets/KernelSpecial.Stem##Values and .Stem##ZeroSize, Targets/Determinism.Stem, once per
// available target, for the algorithms whose cases have a flat tensor's oracle (FlatCases), and
// DeterminismAcrossTargets.Stem for those with TargetRuns; KernelSweep.Stem, Determinism.Stem and
// DeterminismAcrossTargets.Stem of the shaped sweep for the others (ShapedCases). They are
// registered at start-up, as TEST registers its tests, so that an algorithm gets only the suites
// its cases fill.

// Registers test `name` of `suite` running `body`. The fixture is ::testing::Test, as TEST's, so
// that a suite may hold both.
void Register(const std::string& suite, const std::string& name, const std::string& param,
              std::function<void()> body) {
  class Body : public ::testing::Test {
   public:
    explicit Body(std::function<void()> f) : f_(std::move(f)) {}
    void TestBody() override { f_(); }

   private:
    std::function<void()> f_;
  };
  ::testing::RegisterTest(
      suite.c_str(), name.c_str(), nullptr, param.empty() ? nullptr : param.c_str(), __FILE__,
      __LINE__, [body = std::move(body)]() -> ::testing::Test* { return new Body(body); });
}

// Targets/<suite>.<name>/<target> for every available target, run with that target forced.
void RegisterPerTarget(const std::string& suite, const std::string& name,
                       void (*run)(const std::string& target)) {
  for (const std::string& target : test::KernelTargets()) {
    Register("Targets/" + suite, name + "/" + target, "\"" + target + "\"", [run, target] {
      const ForcedTarget forced(target);
      ASSERT_EQ(ActiveTargetName(), target) << "ForceTarget did not take effect";
      run(target);
    });
  }
}

template <class A>
void RegisterAlgorithm(const std::string& stem) {
  if constexpr (FlatCases<A>) {
    RegisterPerTarget("KernelSweep", stem, RunSweep<A>);
    RegisterPerTarget("KernelMixed", stem, RunMixed<A>);
    RegisterPerTarget("KernelLarge", stem, RunLarge<A>);
    RegisterPerTarget("KernelSpecial", stem + "Values", RunSpecialValues<A>);
    RegisterPerTarget("KernelSpecial", stem + "ZeroSize", RunZeroSize<A>);
    RegisterPerTarget("Determinism", stem, RunDeterminism<A>);
  } else if constexpr (ShapedCases<A>) {
    RegisterPerTarget("KernelSweep", stem, RunShapedSweep<A>);
    RegisterPerTarget("Determinism", stem, RunShapedDeterminism<A>);
    Register("DeterminismAcrossTargets", stem, "", RunShapedAcrossTargets<A>);
  }
  if constexpr (requires { A::TargetRuns(); }) {
    Register("DeterminismAcrossTargets", stem, "", [] {
      for (const ref::AcrossTargets<typename A::Hyper>& run : A::TargetRuns())
        RunAcrossTargets<A>(run.group_sets, run.combos, run.all_targets_agree);
    });
  }
}

#define FOPT_REGISTER_ALGORITHM(Stem) \
  RegisterAlgorithm<Algo<algos::Stem, ref::KernelCases<algos::Stem::Hyper>>>(#Stem);
#define FOPT_REGISTER_TEST_ALGORITHM(Stem) \
  RegisterAlgorithm<Algo<test_algos::Stem, test_algos::Stem##Sweep>>(#Stem);
[[maybe_unused]] const bool kRegistered = [] {
  FOPT_FOR_EACH_ALGORITHM(FOPT_REGISTER_ALGORITHM)
#ifdef FOPT_TEST_ALGORITHMS_DIR
  FOPT_FOR_EACH_TEST_ALGORITHM(FOPT_REGISTER_TEST_ALGORITHM)
#endif
  return true;
}();
#undef FOPT_REGISTER_TEST_ALGORITHM
#undef FOPT_REGISTER_ALGORITHM

}  // namespace
}  // namespace fusedopt
