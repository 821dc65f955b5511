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
//                  chunks; for Lion and LAMB also across targets (DeterminismAcrossTargets).
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
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
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

struct Combo {
  DType param;
  DType grad;
  DType state;
  bool master = false;
};

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
// Algorithms: the public step, the oracle, the states in use, the option sweep and initial states.

using StateSpans = std::array<std::span<double>, kMaxStates>;

// What a test algorithm below takes from its descriptor (src/algos/): the Hyper struct, torch's
// state keys, the state slots the hyper-parameters need (RequiredStates, which the golden tests
// hold to torch's state), the public step, and a Hyper as text for the failure messages. The
// algorithm adds the oracle (Ref), its option sweep and its initial states.
template <class D>
struct FromDescriptor {
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

struct SgdAlgo : FromDescriptor<algos::Sgd> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::SgdStep(h, t, p, g, st[0]);
  }
  // {momentum 0, 0.9} × {dampening 0, 0.1, nesterov} × weight_decay × maximize; the last has every
  // feature.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double momentum : {0.0, 0.9}) {
      for (int mode = 0; mode < 3; ++mode) {  // dampening 0, dampening 0.1, nesterov
        if (mode == 2 && momentum == 0.0) continue;
        for (double wd : {0.0, 0.01}) {
          for (bool maximize : {false, true}) {
            out.push_back({.lr = 0.05,
                           .momentum = momentum,
                           .dampening = mode == 1 ? 0.1 : 0.0,
                           .weight_decay = wd,
                           .nesterov = mode == 2,
                           .maximize = maximize});
          }
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    return h;
  }
  // Initial state of a tensor about to take step `step`. At step 1 the buffer is not read: fill it
  // with NaN.
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? std::numeric_limits<double>::quiet_NaN() : rng.Uniform(-0.5, 0.5);
  }
};

template <bool kDecoupled>
struct AdamAlgoT : FromDescriptor<std::conditional_t<kDecoupled, algos::AdamW, algos::Adam>> {
  using Hyper = std::conditional_t<kDecoupled, AdamWHyper, AdamHyper>;
  // Written out here rather than with AdamWHyper::ToAdam, so that the conversion is tested too.
  static AdamHyper AsAdam(const Hyper& h) {
    return {.lr = h.lr,
            .beta1 = h.beta1,
            .beta2 = h.beta2,
            .eps = h.eps,
            .weight_decay = h.weight_decay,
            .amsgrad = h.amsgrad,
            .maximize = h.maximize,
            .decoupled_weight_decay = kDecoupled};
  }
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::AdamStep(AsAdam(h), t, p, g, st[0], st[1], st[2]);
  }
  // amsgrad × weight_decay {0, 0.05} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool amsgrad : {false, true}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          Hyper h;
          h.lr = 0.01;
          h.weight_decay = wd;
          h.amsgrad = amsgrad;
          h.maximize = maximize;
          out.push_back(h);
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state with max_exp_avg_sq ≥ exp_avg_sq.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);  // exp_avg_sq; max_exp_avg_sq is raised to it in MakeSegment
  }
};
using AdamAlgo = AdamAlgoT<false>;
using AdamWAlgo = AdamAlgoT<true>;

struct RmspropAlgo : FromDescriptor<algos::Rmsprop> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::RmspropStep(h, t, p, g, st[0], st[1], st[2]);
  }
  // centered × momentum {0, 0.9} × weight_decay × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool centered : {false, true}) {
      for (double momentum : {0.0, 0.9}) {
        for (double wd : {0.0, 0.01}) {
          for (bool maximize : {false, true}) {
            out.push_back({.lr = 0.01,
                           .weight_decay = wd,
                           .momentum = momentum,
                           .centered = centered,
                           .maximize = maximize});
          }
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.alpha = 0.9;
    return h;
  }
  // Zero at step 1; later square_avg > 0 and grad_avg² ≤ square_avg / 4 (as any running average
  // keeps it).
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kSquareAvg) return rng.Uniform(0.05, 1.0);
    return rng.Uniform(-0.5,
                       0.5);  // momentum_buffer; grad_avg is scaled by √square_avg in MakeSegment
  }
};

struct AdagradAlgo : FromDescriptor<algos::Adagrad> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::AdagradStep(h, t, p, g, st[0]);
  }
  // lr_decay {0, 0.01} × weight_decay × initial_accumulator_value {0, 0.1} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double lr_decay : {0.0, 0.01}) {
      for (double wd : {0.0, 0.01}) {
        for (double init : {0.0, 0.1}) {
          for (bool maximize : {false, true}) {
            out.push_back({.lr = 0.05,
                           .lr_decay = lr_decay,
                           .weight_decay = wd,
                           .initial_accumulator_value = init,
                           .maximize = maximize});
          }
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.lr_decay = h.lr_decay == 0.0 ? 0.05 : 0.0;
    return h;
  }
  // initial_accumulator_value at step 1 (the caller fills it, as torch's constructor); later more.
  static double InitState(const Hyper& h, int /*slot*/, std::int64_t step, Rng& rng) {
    return h.initial_accumulator_value + (step == 1 ? 0.0 : rng.Uniform(0.0, 2.0));
  }
};

struct AdamaxAlgo : FromDescriptor<algos::Adamax> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::AdamaxStep(h, t, p, g, st[0], st[1]);
  }
  // weight_decay {0, 0.05} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.05}) {
      for (bool maximize : {false, true}) {
        out.push_back({.lr = 0.01, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    h.beta2 = 0.99;
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state: exp_inf is a decayed max of |g| + eps.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kAdamaxExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.05, 1.0);
  }
};

struct AdadeltaAlgo : FromDescriptor<algos::Adadelta> {
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    ref::AdadeltaStep(h, p, g, st[0], st[1]);
  }
  // weight_decay {0, 0.05} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.05}) {
      for (bool maximize : {false, true}) {
        out.push_back({.lr = 0.5, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.0;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.rho = 0.8;
    h.eps = 1e-4;
    return h;
  }
  // Zero at step 1 (as torch); later running means of g² and of the (smaller) squared steps.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kAdadeltaSquareAvg) return rng.Uniform(0.05, 1.0);
    return rng.Uniform(1e-3, 0.1);
  }
};

struct RadamAlgo : FromDescriptor<algos::Radam> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::RadamStep(h, t, p, g, st[0], st[1]);
  }
  // decoupled_weight_decay × weight_decay {0, 0.05} × maximize. With beta2 = 0.999 steps 1-5 are
  // not rectified and later ones are: the sweep's tensors start at steps 1, 2 and 7, and its
  // 20-step cases cross step 6.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool decoupled : {false, true}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          out.push_back({.lr = 0.01,
                         .weight_decay = wd,
                         .decoupled_weight_decay = decoupled,
                         .maximize = maximize});
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    h.beta2 = 0.99;
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kRadamExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
};

struct NadamAlgo : FromDescriptor<algos::Nadam> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::NadamStep(h, t, p, g, st[0], st[1]);
  }
  // decoupled_weight_decay × weight_decay {0, 0.05} × maximize, and a momentum_decay of 0 (mu
  // constant) besides torch's default.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool decoupled : {false, true}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          out.push_back({.lr = 0.01,
                         .weight_decay = wd,
                         .decoupled_weight_decay = decoupled,
                         .maximize = maximize});
        }
      }
    }
    out.push_back({.lr = 0.01, .momentum_decay = 0.0});
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    h.beta2 = 0.99;
    h.momentum_decay = 0.01;
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kNadamExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
  // mu_product before step `step`: the product of mu_1 .. mu_{step-1}, in f32 as torch keeps it.
  static void InitScalars(const Hyper& h, std::int64_t step, std::span<float, kMaxScalars> out) {
    float product = 1.0f;
    for (std::int64_t i = 1; i < step; ++i)
      product *= static_cast<float>(ref::NadamMu(h, static_cast<double>(i)));
    out[kNadamMuProduct] = product;
  }
};

struct RmsproptfAlgo : FromDescriptor<algos::Rmsproptf> {
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    ref::RmsproptfStep(h, p, g, st[0], st[1], st[2]);
  }
  // All 18 modes: weight decay {none, coupled, decoupled} × centered × momentum {none, lr in the
  // buffer, lr on the step}.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (int decay = 0; decay < 3; ++decay) {
      for (bool centered : {false, true}) {
        for (int mode = 0; mode < 3; ++mode) {
          out.push_back({.lr = 0.01,
                         .weight_decay = decay == 0 ? 0.0 : 0.05,
                         .momentum = mode == 0 ? 0.0 : 0.9,
                         .centered = centered,
                         .decoupled_decay = decay == 2,
                         .lr_in_momentum = mode != 2});
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.alpha = 0.8;
    h.eps = 1e-6;
    return h;
  }
  // square_avg is 1 at step 1 (as the reference), the others 0; later square_avg > 0 and
  // grad_avg² ≤ square_avg / 4 (MakeSegment scales grad_avg).
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return slot == kRmsproptfSquareAvg ? 1.0 : 0.0;
    if (slot == kRmsproptfSquareAvg) return rng.Uniform(0.05, 1.0);
    return rng.Uniform(-0.5, 0.5);
  }
};

struct AsgdAlgo : FromDescriptor<algos::Asgd> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::AsgdStep(h, t, p, g, st[0]);
  }
  // weight_decay {0, 0.05} × maximize × t0 {torch's 1e6: ax a copy of the param; 2: averaging from
  // step 5 on, so the sweep's tensors starting at step 7 average and its 20-step cases cross into
  // it}; the last has every feature and a larger lambd, another alpha.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double t0 : {1e6, 2.0}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          out.push_back({.lr = 0.05, .t0 = t0, .weight_decay = wd, .maximize = maximize});
        }
      }
    }
    out.push_back({.lr = 0.05,
                   .lambd = 0.1,
                   .alpha = 0.5,
                   .t0 = 2.0,
                   .weight_decay = 0.05,
                   .maximize = true});
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.lambd = 0.01;
    h.alpha = 0.6;
    h.t0 = h.t0 == 2.0 ? 1e6 : 3.0;
    return h;
  }
  // Zero at step 1 (as torch); later an average near the params.
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? 0.0 : rng.Uniform(-1.0, 1.0);
  }
  // eta and mu before step `step`, as step - 1 left them (torch's f32 0-d tensors): lr / (1 +
  // lambd·lr·(step − 1))^alpha and 1 / max(1, step − 1 − t0), each rounded once.
  static void InitScalars(const Hyper& h, std::int64_t step, std::span<float, kMaxScalars> out) {
    const auto before = static_cast<double>(step - 1);
    out[kAsgdEta] = static_cast<float>(h.lr / std::pow(1.0 + h.lambd * h.lr * before, h.alpha));
    out[kAsgdMu] = static_cast<float>(1.0 / std::max(1.0, before - h.t0));
  }
};

struct RpropAlgo : FromDescriptor<algos::Rprop> {
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    ref::RpropStep(h, p, g, st[0], st[1]);
  }
  // maximize × {torch's etas and step sizes, other etas, step sizes that clamp (the sweep's step
  // sizes start in [1e-4, 0.05] and grow or shrink by 1.5 or 0.25 a step)}.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool maximize : {false, true}) {
      out.push_back({.lr = 0.01, .maximize = maximize});
      out.push_back({.lr = 0.01, .etaminus = 0.25, .etaplus = 1.5, .maximize = maximize});
      out.push_back({.lr = 0.01,
                     .etaminus = 0.25,
                     .etaplus = 1.5,
                     .step_size_min = 1e-3,
                     .step_size_max = 0.02,
                     .maximize = maximize});
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.maximize = !h.maximize;
    h.etaminus = 0.4;
    h.etaplus = 1.3;
    return h;
  }
  // At step 1 as torch: prev 0, step_size lr. Later a previous gradient of either sign (or 0) and
  // a step size within the bounds.
  static double InitState(const Hyper& h, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return slot == kRpropStepSize ? h.lr : 0.0;
    if (slot == kRpropStepSize)
      return rng.Uniform(h.step_size_min, std::min(h.step_size_max, 0.05));
    const double u = rng.Uniform(-1.0, 1.0);
    return std::abs(u) < 0.1 ? 0.0 : u;
  }
};

// BertAdam: the oracle clips per (group, param dtype) as the reference's flat buffers
// (ScaleGrads, before Ref). With these inputs (|g| < 1, 0-65 elements a segment) a group's norm is
// a few units: max_grad_norm 1 clips on every step, 5 on some, -1 never. The schedules run past
// t_total (first steps 1, 7, 2 and 20 steps).
struct BertAdamAlgo : FromDescriptor<algos::BertAdam> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::BertAdamStep(h, t, 1.0, p, g, st[0], st[1]);  // g: clipped by ScaleGrads
  }
  // Each (group, param dtype)'s factor from its Σg², applied to its segments' oracle gradients.
  template <class Seg>
  static void ScaleGrads(std::span<const Hyper> groups, const std::vector<Seg>& segs,
                         std::vector<std::vector<double>>& grads) {
    std::map<std::pair<std::uint32_t, DType>, double> sums;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      double& sum = sums[{segs[i].spec.group, segs[i].spec.combo.param}];
      for (double x : grads[i]) sum += x * x;
    }
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const double clip = ref::BertAdamClip(groups[segs[i].spec.group].max_grad_norm,
                                            sums[{segs[i].spec.group, segs[i].spec.combo.param}]);
      for (double& x : grads[i]) x *= clip;
    }
  }
  // Constant lr with clipping and weight decay (the reference's defaults), neither, and each
  // schedule with a warmup (cosine: none), clipped at 1, 5 or 2.
  static std::vector<Hyper> Options() {
    return {
        {.lr = 0.01},
        {.lr = 0.01, .weight_decay = 0.0, .max_grad_norm = -1.0},
        {.lr = 0.01, .warmup = 0.2, .t_total = 10, .max_grad_norm = 5.0},
        {.lr = 0.01, .warmup = 0.1, .t_total = 30, .schedule = kBertAdamWarmupConstant},
        {.lr = 0.01, .t_total = 25, .schedule = kBertAdamWarmupCosine, .weight_decay = 0.05},
        {.lr = 0.01,
         .warmup = 0.3,
         .t_total = 15,
         .schedule = kBertAdamWarmupPoly,
         .max_grad_norm = 2.0},
    };
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.b1 = 0.8;
    h.e = 1e-4;
    h.max_grad_norm = h.max_grad_norm == 1.0 ? 3.0 : 1.0;
    return h;
  }
  // Zero at step 1; later a plausible state.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kBertAdamExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
};

// A fixed sign for element index i, mixed by a hash so that SIMD lanes and tails see both: Lion's
// and LAMB's inputs keep it on every step (see LionAlgo and LambAlgo).
int ElementSign(std::size_t i) {
  return ((static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 40 & 1u) != 0 ? -1 : 1;
}

// Lion's update is ±lr·sign(c), c = β1·m + (1 − β1)·g: where |c| is tiny next to its terms, f32
// and the double oracle may disagree on the sign, and the param then differs by 2·lr. Lion's inputs
// therefore keep c far from 0: element i has the sign s_i = ElementSign(i) and a class k_i, the
// same on every step, so its gradients never change sign and its momentum does not cross 0 within
// a case (20 steps, β1 >= 0.8, β2 = 0.99):
//   k = 0: g = s·[0.2, 1],  m = s'·[0, 0.5]: c has the sign of g, |c| < 1;
//   k = 1: g = s·[50, 100], m = s'·[0, 0.5]: c has the sign of g, |c| >= 5;
//   k = 2: g = s·[0.2, 1],  m = −s'·[3, 6]:  c has the sign of m, against g; |c| ~ 1.6 to 5.4;
// s' = s, or −s with maximize. Fresh tensors start from m = 0, so there k = 2 acts as k = 0. A sign
// that is right only for |c| in [2, 4), as DeepSpeed's AVX Lion computes it (its mask keeps the
// exponent bits of −1), fails on classes 0 and 1; sign(g) or sign(m) alone fails on class 2 or on
// fresh tensors.
int LionElementClass(std::size_t i) {
  return static_cast<int>(((static_cast<std::uint64_t>(i) * 0xC2B2AE3D27D4EB4Full) >> 33) % 3u);
}

struct LionAlgo : FromDescriptor<algos::Lion> {
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    ref::LionStep(h, p, g, st[0]);
  }
  // weight_decay {0, 0.5} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.5}) {
      for (bool maximize : {false, true}) {
        out.push_back({.lr = 0.01, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
  // β2 stays 0.99: the class-2 momentum must not decay through 0 within 20 steps.
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.2 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    return h;
  }
  // Zero at step 1 (as lion-pytorch); later the magnitude of the class's momentum, to which
  // MakeSegment gives its sign.
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? 0.0 : rng.Uniform(0.0, 1.0);
  }
  // Element i's momentum from InitState's u in [0, 1) (see the classes above).
  static double Momentum(const Hyper& h, std::size_t i, double u) {
    const double s = ElementSign(i) * (h.maximize ? -1.0 : 1.0);
    return LionElementClass(i) == 2 ? -s * (3.0 + 3.0 * u) : s * 0.5 * u;
  }
};

// LAMB moves a one-element tensor by lr·|θ|·sign(u) (the trust ratio is lr·|θ|/|u|), so there a u
// that cancels to near 0 (m = β1·m + β3·g with m against g, or u + λθ against u) may take another
// sign in f32 than in double, as Lion's c. LAMB's inputs therefore give element i's gradients the
// sign ElementSign(i) on every step, and its momentum and param that sign at the start: m never
// cancels, and u + λθ adds terms of one sign until θ crosses 0, which a one-element θ never does
// (it shrinks by lr·|θ|). In longer tensors a near-zero u costs only its own tiny share of the
// update.
struct LambAlgo : FromDescriptor<algos::Lamb> {
  // The oracle computes its own ‖θ‖ and ‖u‖ of the whole tensor in double.
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::LambStep(h, t, p, g, st[0], st[1]);
  }
  // Weight decay {0.02, 0, 0 with use_nvlamb} × adam_w_mode, each with two of the four
  // (bias_correction, grad_averaging) pairs, so that every pair meets both modes and all three
  // decays. The first has FusedLAMB's default modes; first and last have a trust ratio.
  static std::vector<Hyper> Options() {
    struct Row {
      double wd;
      bool nvlamb, adam_w_mode, bias_correction, grad_averaging;
    };
    constexpr Row kRows[] = {
        {0.02, false, true, true, true},   {0.02, false, true, false, false},
        {0.0, false, true, true, false},   {0.0, false, true, false, true},
        {0.0, true, true, true, true},     {0.0, true, true, false, false},
        {0.0, false, false, true, true},   {0.0, false, false, false, false},
        {0.0, true, false, true, false},   {0.0, true, false, false, true},
        {0.02, false, false, true, false}, {0.02, false, false, false, true},
    };
    std::vector<Hyper> out;
    for (const Row& r : kRows) {
      out.push_back({.lr = 0.01,
                     .weight_decay = r.wd,
                     .bias_correction = r.bias_correction,
                     .adam_w_mode = r.adam_w_mode,
                     .grad_averaging = r.grad_averaging,
                     .use_nvlamb = r.nvlamb});
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.05 : 0.0;
    h.use_nvlamb = !h.use_nvlamb;
    h.beta1 = 0.8;
    return h;
  }
  // Zero at step 1 (as apex); later a plausible state.
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kLambExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
};

// LARS: LARC's trust ratio from ‖θ‖ and ‖g‖ (the oracle computes its own, in double), then SGD's
// momentum modes. With these inputs LARC's rate tc·‖θ‖/(‖g‖ + λ‖θ‖ + ε) is about 0.02·0.58/0.6:
// lr 0.005 puts clip mode's min(rate / lr, 1) at 1 (and OtherGroup's 0.0125 too), lr 0.05 below 1,
// so both sides of the min are swept; |g| >= 0.2 keeps g + λθ away from 0.
struct LarsAlgo : FromDescriptor<algos::Lars> {
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::LarsStep(h, t, p, g, st[0]);
  }
  // {no momentum, momentum 0.9, with dampening 0.1, nesterov} × weight_decay {0, 0.01} ×
  // {clip at lr 0.005 (ratio 1), clip at lr 0.05 (ratio < 1), scale mode}; the last has every
  // feature.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (int mode = 0; mode < 4; ++mode) {
      for (double wd : {0.0, 0.01}) {
        for (int clip = 0; clip < 3; ++clip) {
          out.push_back({.lr = clip == 0 ? 0.005 : 0.05,
                         .momentum = mode == 0 ? 0.0 : 0.9,
                         .dampening = mode == 2 ? 0.1 : 0.0,
                         .weight_decay = wd,
                         .nesterov = mode == 3,
                         .clip = clip != 2});
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.trust_coefficient = 0.05;
    h.eps = 1e-4;
    return h;
  }
  // As SGD's: at step 1 the buffer is not read (NaN).
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? std::numeric_limits<double>::quiet_NaN() : rng.Uniform(-0.5, 0.5);
  }
};

// AdamP: the oracle decides the projection from its own double sums. Segments of the sweep's and
// the determinism workload's sizes get channel rows (Rows): a (1, 1) param, 2-8 rows of 4-13
// elements, rows spanning ATen's grain and chunks; the others are 1-D. delta 10 projects every
// channel view (|cos| ≤ 1 < 10 / √13), delta 1 some channel and many layer views, 0.1 few.
struct AdampAlgo : FromDescriptor<algos::Adamp> {
  static std::size_t Rows(std::size_t n) {
    switch (n) {
      case 1:
        return 1;
      case 8:
        return 2;
      case 9:
      case 33333:
        return 3;
      case 63:
        return 7;
      case 64:
        return 8;
      case 65:
        return 5;
      case 40000:
        return 16;
      default:
        return 0;
    }
  }
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ref::AdampStep(h, t, Rows(p.size()), p, g, st[0], st[1]);
  }
  // delta {10, 1, 0.1} × nesterov × weight_decay {0, 0.05}; the first projects every channel view.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double delta : {10.0, 1.0, 0.1}) {
      for (bool nesterov : {false, true}) {
        for (double wd : {0.05, 0.0}) {
          out.push_back({.lr = 0.01, .weight_decay = wd, .delta = delta, .nesterov = nesterov});
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.wd_ratio = 0.5;
    h.beta1 = 0.8;
    return h;
  }
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kAdampExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
};

#ifdef FOPT_TEST_ALGORITHMS_DIR
// A test-only algorithm (tests/algos/): its descriptor's data and its sweep's (oracle, options,
// initial states), as Stem##Algo.
template <class D, class Sweep>
struct TestAlgorithm : FromDescriptor<D>, Sweep {
  using Hyper = typename D::Hyper;
  using Sweep::InitState;
  using Sweep::Options;
  using Sweep::OtherGroup;
  using Sweep::Ref;
};
#  define FOPT_TEST_ALGORITHM(Stem) \
    using Stem##Algo = TestAlgorithm<test_algos::Stem, test_algos::Stem##Sweep>;
FOPT_FOR_EACH_TEST_ALGORITHM(FOPT_TEST_ALGORITHM)
#  undef FOPT_TEST_ALGORITHM
#endif

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
  // Segment::scalars (NAdam's mu_product), advanced by the step itself.
  std::array<float, kMaxScalars> scalars{};
  std::size_t rows = 0;  // Segment::rows (AdamP's channel rows)
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
  if constexpr (std::is_same_v<A, LambAlgo>) {
    for (std::size_t i = 0; i < spec.n; ++i) {  // the element's sign, see LambAlgo
      const double sign = ElementSign(i);
      if (s.master) {
        s.master->Set(i, sign * std::abs(s.master->Get(i)));
        s.param.Set(i, s.master->Get(i));
      } else {
        s.param.Set(i, sign * std::abs(s.param.Get(i)));
      }
      s.state[kLambExpAvg]->Set(i, sign * std::abs(s.state[kLambExpAvg]->Get(i)));
    }
  }
  if (spec.first_step > 1) {
    // Cross-state invariants of a real run.
    if constexpr (std::is_same_v<A, AdamAlgo> || std::is_same_v<A, AdamWAlgo>) {
      if (s.state[kMaxExpAvgSq]) {
        for (std::size_t i = 0; i < spec.n; ++i) {
          s.state[kMaxExpAvgSq]->Set(i, s.state[kExpAvgSq]->Get(i) + rng.Uniform(0.0, 0.2));
        }
      }
    }
    if constexpr (std::is_same_v<A, LionAlgo>) {
      for (std::size_t i = 0; i < spec.n; ++i) {
        s.state[kLionExpAvg]->Set(i, LionAlgo::Momentum(h, i, s.state[kLionExpAvg]->Get(i)));
      }
    }
    if constexpr (std::is_same_v<A, RmspropAlgo>) {
      if (s.state[kGradAvg]) {
        for (std::size_t i = 0; i < spec.n; ++i) {
          s.state[kGradAvg]->Set(i,
                                 rng.Uniform(-0.5, 0.5) * std::sqrt(s.state[kSquareAvg]->Get(i)));
        }
      }
    }
    if constexpr (std::is_same_v<A, RmsproptfAlgo>) {
      if (s.state[kRmsproptfGradAvg]) {
        for (std::size_t i = 0; i < spec.n; ++i) {
          s.state[kRmsproptfGradAvg]->Set(
              i, rng.Uniform(-0.5, 0.5) * std::sqrt(s.state[kRmsproptfSquareAvg]->Get(i)));
        }
      }
    }
  }
  s.SyncOracle();
  return s;
}

// Lion's gradient of element i: the sign s_i on every step and, for random gradients, the class's
// magnitude (see the comment above LionElementClass).
double LionGrad(GradKind kind, std::size_t i, Rng& rng) {
  const double s = ElementSign(i);
  switch (kind) {
    case GradKind::kRandom:
    case GradKind::kNonFinite:
      return s * (LionElementClass(i) == 1 ? rng.Uniform(50.0, 100.0) : rng.Uniform(0.2, 1.0));
    case GradKind::kZero:
      return 0.0;
    case GradKind::kHuge:
      return s * rng.Uniform(0.5, 1.0) * 1e4;
    case GradKind::kTiny:
      return s * rng.Uniform(0.1, 1.0) * 1e-12;
  }
  return 0.0;
}

template <class A>
void FillGrads(SegData& s, GradKind kind, Rng& rng) {
  for (std::size_t i = 0; i < s.spec.n; ++i) {
    double g = 0.0;
    if constexpr (std::is_same_v<A, LionAlgo>) {
      g = LionGrad(kind, i, rng);
    } else {
      switch (kind) {
        case GradKind::kRandom:
        case GradKind::kNonFinite:
          // |g| >= 0.2 keeps g + λθ away from 0: near |g| ~ eps the first steps of Adam, RMSprop
          // and Adagrad compute g / (|g| + eps), which amplifies f32 rounding of g + λθ without
          // bound. Zero and tiny gradients have their own cases.
          g = rng.Uniform(0.2, 1.0) * (rng.Next() & 1 ? 1.0 : -1.0);
          break;
        case GradKind::kZero:
          g = 0.0;
          break;
        case GradKind::kHuge:
          g = rng.Uniform(0.5, 1.0) * (rng.Next() & 1 ? 1e4 : -1e4);
          break;
        case GradKind::kTiny:
          g = rng.Uniform(-1.0, 1.0) * 1e-12;
          break;
      }
      if constexpr (std::is_same_v<A, LambAlgo>) g = ElementSign(i) * std::abs(g);
    }
    s.grad.Set(i, g);
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
    // Clipping across segments (BertAdam's per (group, dtype) norms) scales the oracle's gradients.
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

// ------------------------------------------------------------------------------------------------
// Fixtures: one instance per available target

class TargetTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    forced_.emplace(GetParam());
    ASSERT_EQ(ActiveTargetName(), GetParam()) << "ForceTarget did not take effect";
  }
  void TearDown() override { forced_.reset(); }
  const std::string& target() const { return GetParam(); }

 private:
  std::optional<ForcedTarget> forced_;
};

std::string TargetParamName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

class KernelSweep : public TargetTest {};
class KernelMixed : public TargetTest {};
class KernelLarge : public TargetTest {};
class KernelSpecial : public TargetTest {};
class Determinism : public TargetTest {};

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
        for (std::size_t r = 0; r < runs.size(); ++r) {
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

// Every suite above for one algorithm, Stem##Algo: KernelSweep.Stem, KernelMixed.Stem,
// KernelLarge.Stem, KernelSpecial.Stem##Values and .Stem##ZeroSize, Determinism.Stem.
#define FOPT_KERNEL_TESTS(Stem)                                                   \
  TEST_P(KernelSweep, Stem) { RunSweep<Stem##Algo>(target()); }                   \
  TEST_P(KernelMixed, Stem) { RunMixed<Stem##Algo>(target()); }                   \
  TEST_P(KernelLarge, Stem) { RunLarge<Stem##Algo>(target()); }                   \
  TEST_P(KernelSpecial, Stem##Values) { RunSpecialValues<Stem##Algo>(target()); } \
  TEST_P(KernelSpecial, Stem##ZeroSize) { RunZeroSize<Stem##Algo>(target()); }    \
  TEST_P(Determinism, Stem) { RunDeterminism<Stem##Algo>(target()); }
FOPT_KERNEL_TESTS(Sgd)
FOPT_KERNEL_TESTS(Adam)
FOPT_KERNEL_TESTS(AdamW)
FOPT_KERNEL_TESTS(Rmsprop)
FOPT_KERNEL_TESTS(Adagrad)
FOPT_KERNEL_TESTS(Lion)
FOPT_KERNEL_TESTS(Lamb)
FOPT_KERNEL_TESTS(Adamax)
FOPT_KERNEL_TESTS(Adadelta)
FOPT_KERNEL_TESTS(Radam)
FOPT_KERNEL_TESTS(Nadam)
FOPT_KERNEL_TESTS(Rmsproptf)
FOPT_KERNEL_TESTS(Asgd)
FOPT_KERNEL_TESTS(Lars)
FOPT_KERNEL_TESTS(Rprop)
FOPT_KERNEL_TESTS(Adamp)
FOPT_KERNEL_TESTS(BertAdam)
#ifdef FOPT_TEST_ALGORITHMS_DIR
FOPT_FOR_EACH_TEST_ALGORITHM(FOPT_KERNEL_TESTS)
#endif
#undef FOPT_KERNEL_TESTS

// ------------------------------------------------------------------------------------------------
// DeterminismAcrossTargets: the determinism workload on every available target (with 1, 2 or 3
// threads in turn). Targets of one class (FMA: AVX2 and up; non-FMA: SSE4 and SSSE3 where built,
// SCALAR) must agree bit for bit whatever their vector width: LAMB's per-tensor norms are reduced
// in a fixed order of 16 accumulators, never per lane. Between the classes only MulAdd rounds
// differently, so inputs where every MulAdd is exact must agree on every target:
//   Lion with β1 = β2 = 0.5: c and m are fma(0.5, g, 0.5·m), whose product is exact;
//   LAMB with β1 = β2 = 0, no grad averaging or bias correction, eps 0, no weight decay,
//   use_nvlamb, and 16-bit gradients (g² exact in f32): m = g, v = g², u = ±1 exactly, so p ∓ ratio
//   rounds once on every target and the result checks ‖θ‖ and the trust ratio across vector widths.

template <class A>
void RunAcrossTargets(const std::vector<std::vector<typename A::Hyper>>& group_sets,
                      const std::vector<Combo>& combos, bool all_targets_agree) {
  test::TargetGuard guard;
  const std::vector<std::string> targets = AvailableTargets();
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

TEST(DeterminismAcrossTargets, Lion) {
  const std::vector<LionHyper> options = LionAlgo::Options();
  std::vector<std::vector<LionHyper>> per_class;
  for (const LionHyper& h : {options.front(), options.back()})
    per_class.push_back({h, LionAlgo::OtherGroup(h)});
  const std::vector<Combo> combos = {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16},
                                     Combo{kF16, kF16, kF32, true}};
  RunAcrossTargets<LionAlgo>(per_class, combos, /*all_targets_agree=*/false);
  const LionHyper exact{.lr = 0.01, .beta1 = 0.5, .beta2 = 0.5, .weight_decay = 0.5};
  const LionHyper exact_other{
      .lr = 0.025, .beta1 = 0.5, .beta2 = 0.5, .weight_decay = 0.0, .maximize = true};
  RunAcrossTargets<LionAlgo>({{exact, exact_other}}, combos, /*all_targets_agree=*/true);
}

TEST(DeterminismAcrossTargets, Lamb) {
  const std::vector<LambHyper> options = LambAlgo::Options();
  std::vector<std::vector<LambHyper>> per_class;
  for (const LambHyper& h : {options.front(), options.back()})
    per_class.push_back({h, LambAlgo::OtherGroup(h)});
  RunAcrossTargets<LambAlgo>(
      per_class,
      {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16}, Combo{kF16, kF16, kF32, true}},
      /*all_targets_agree=*/false);
  const LambHyper exact{.lr = 0.01,
                        .beta1 = 0.0,
                        .beta2 = 0.0,
                        .eps = 0.0,
                        .weight_decay = 0.0,
                        .bias_correction = false,
                        .grad_averaging = false,
                        .use_nvlamb = true};
  LambHyper exact_other = exact;
  exact_other.lr = 0.03;
  RunAcrossTargets<LambAlgo>(
      {{exact, exact_other}},
      {Combo{kF32, kBF16, kF32}, Combo{kBF16, kBF16, kBF16}, Combo{kF16, kF16, kF32, true}},
      /*all_targets_agree=*/true);
}

// BertAdam's clip factors come from the same fixed-order sums as LAMB's norms: targets of one
// class agree bit for bit (clipped and not).
TEST(DeterminismAcrossTargets, BertAdam) {
  const std::vector<BertAdamHyper> options = BertAdamAlgo::Options();
  std::vector<std::vector<BertAdamHyper>> per_class;
  for (const BertAdamHyper& h : {options.front(), options[1], options.back()})
    per_class.push_back({h, BertAdamAlgo::OtherGroup(h)});
  RunAcrossTargets<BertAdamAlgo>(
      per_class,
      {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16}, Combo{kF16, kF16, kF32, true}},
      /*all_targets_agree=*/false);
}

// LARS's norms come from the same fixed-order sums as LAMB's: targets of one class agree bit for
// bit (scale mode, and clip mode below and at the clip).
TEST(DeterminismAcrossTargets, Lars) {
  const std::vector<LarsHyper> options = LarsAlgo::Options();
  std::vector<std::vector<LarsHyper>> per_class;
  for (const LarsHyper& h : {options.front(), options[options.size() - 2], options.back()})
    per_class.push_back({h, LarsAlgo::OtherGroup(h)});
  RunAcrossTargets<LarsAlgo>(
      per_class,
      {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16}, Combo{kF16, kF16, kF32, true}},
      /*all_targets_agree=*/false);
}

// AdamP's per-row sums come from the same fixed-order accumulators: targets of one class agree bit
// for bit, projected per channel (delta 10) or not.
TEST(DeterminismAcrossTargets, Adamp) {
  const std::vector<AdampHyper> options = AdampAlgo::Options();
  std::vector<std::vector<AdampHyper>> per_class;
  for (const AdampHyper& h : {options.front(), options.back()})
    per_class.push_back({h, AdampAlgo::OtherGroup(h)});
  RunAcrossTargets<AdampAlgo>(
      per_class,
      {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16}, Combo{kF16, kF16, kF32, true}},
      /*all_targets_agree=*/false);
}

INSTANTIATE_TEST_SUITE_P(Targets, KernelSweep, ::testing::ValuesIn(AvailableTargets()),
                         TargetParamName);
INSTANTIATE_TEST_SUITE_P(Targets, KernelMixed, ::testing::ValuesIn(AvailableTargets()),
                         TargetParamName);
INSTANTIATE_TEST_SUITE_P(Targets, KernelLarge, ::testing::ValuesIn(AvailableTargets()),
                         TargetParamName);
INSTANTIATE_TEST_SUITE_P(Targets, KernelSpecial, ::testing::ValuesIn(AvailableTargets()),
                         TargetParamName);
INSTANTIATE_TEST_SUITE_P(Targets, Determinism, ::testing::ValuesIn(AvailableTargets()),
                         TargetParamName);

// ------------------------------------------------------------------------------------------------
// Adafactor: factored states (row_var batch·rows, col_var batch·cols) do not fit the generic
// sweep's param-shaped buffers, so it has its own: every shape kind (vectors; matrices of one tile,
// several row tiles, several column tiles, a batch) in one call of two groups, against
// ref::AdafactorStep.

struct AdafactorShape {
  std::size_t rows, cols, numel;  // rows = cols = 0: a vector
};
const std::vector<AdafactorShape>& AdafactorShapes() {
  static const std::vector<AdafactorShape> shapes = {{0, 0, 1},
                                                     {0, 0, 7},
                                                     {0, 0, 65},
                                                     {0, 0, 40000},
                                                     {1, 1, 1},
                                                     {3, 5, 15},
                                                     {7, 33, 231},
                                                     {2, 4100, 3 * 2 * 4100},
                                                     {1100, 40, 44000},
                                                     {5, 300, 3 * 5 * 300},
                                                     {9, 1, 9},
                                                     {1, 64, 2 * 64},
                                                     // small matrices grouped into tiles (a conv's
                                                     // 3x3 and 1x1 kernels), two tiles each
                                                     {3, 3, 9 * 5000},
                                                     {1, 1, 40000}};
  return shapes;
}

// One Adafactor segment's buffers and the oracle's copy.
struct AdafactorCase {
  AdafactorShape shape;
  std::uint32_t group = 0;
  std::int64_t step = 1;  // of the next call
  Buffer param, grad, row_var, col_var, variance;
  std::optional<Buffer> master;
  std::vector<double> p, g, rv, cv, var;  // the oracle's

  AdafactorCase(const AdafactorShape& sh, const Combo& c, std::uint32_t grp, std::int64_t first,
                bool unaligned, Rng& rng)
      : shape(sh),
        group(grp),
        step(first),
        param(c.param, sh.numel, unaligned),
        grad(c.grad, sh.numel, unaligned),
        row_var(c.state, Batch() * sh.rows, unaligned),
        col_var(c.state, Batch() * sh.cols, unaligned),
        variance(c.state, sh.rows == 0 ? sh.numel : 0, unaligned) {
    if (c.master) master.emplace(kF32, sh.numel, unaligned);
    for (std::size_t i = 0; i < sh.numel; ++i) {
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
    const auto init = [&](Buffer& b) {
      for (std::size_t i = 0; i < b.size(); ++i) {
        b.Set(i, first == 1 ? 0.0 : rng.Uniform(1e-4, 0.02));
      }
      return b.ToDouble();
    };
    rv = init(row_var);
    cv = init(col_var);
    var = init(variance);
  }
  std::size_t Batch() const {
    return shape.rows == 0 ? 0 : shape.numel / (shape.rows * shape.cols);
  }

  void NewGrad(Rng& rng, double scale) {
    for (std::size_t i = 0; i < shape.numel; ++i) grad.Set(i, rng.Uniform(-scale, scale));
    g = grad.ToDouble();
  }
  Segment MakeSegment(const Combo& c) {
    Segment s;
    s.param = param.data();
    s.grad = grad.data();
    s.master = master ? static_cast<float*>(master->data()) : nullptr;
    if (shape.rows > 0) {
      s.state[kAdafactorRowVar] = row_var.data();
      s.state[kAdafactorColVar] = col_var.data();
    } else {
      s.state[kAdafactorVariance] = variance.data();
    }
    s.numel = shape.numel;
    s.rows = shape.rows;
    s.cols = shape.cols;
    s.param_dtype = c.param;
    s.grad_dtype = c.grad;
    s.state_dtype = c.state;
    s.group = group;
    s.step = step;
    return s;
  }
  void OracleStep(const AdafactorHyper& h) {
    ref::AdafactorStep(h, step, shape.rows, shape.cols, p, g, rv, cv, var);
  }
  // The oracle restarts from the kernel's (rounded) buffers: the per-step check of 16-bit storage.
  void SyncOracle() {
    p = master ? master->ToDouble() : param.ToDouble();
    rv = row_var.ToDouble();
    cv = col_var.ToDouble();
    var = variance.ToDouble();
  }
};

std::vector<AdafactorHyper> AdafactorOptions() {
  return {
      AdafactorHyper{},
      // lr above 1/√t (ρ = 1/√t), decay, maximize, a large eps1 (V clamped), clipping at d = 1
      AdafactorHyper{.lr = 1.0, .eps1 = 0.3, .weight_decay = 0.1, .maximize = true},
      // eps2 above RMS(p), a large d (no clipping), slow decay of β2
      AdafactorHyper{.lr = 0.05,
                     .beta2_decay = -0.3,
                     .eps1 = 1e-30,
                     .eps2 = 2.0,
                     .d = 50.0,
                     .weight_decay = 0.0},
  };
}
AdafactorHyper AdafactorOtherGroup(AdafactorHyper h) {
  h.lr *= 0.5;
  h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
  h.beta2_decay = -0.6;
  return h;
}
std::string DescribeAdafactor(const AdafactorHyper& h) {
  std::ostringstream o;
  o << "Adafactor{lr=" << h.lr << " beta2_decay=" << h.beta2_decay << " eps=(" << h.eps1 << ","
    << h.eps2 << ") d=" << h.d << " wd=" << h.weight_decay << " maximize=" << h.maximize << "}";
  return o.str();
}

// |k − r| ≤ rtol·|r| + atol·max|r| + floor over a buffer; "" when it holds.
std::string CompareAdafactor(const char* what, const std::vector<double>& k,
                             const std::vector<double>& r, double rtol, double atol,
                             double floor = 0.0) {
  double scale = 0.0;
  for (const double x : r) scale = std::max(scale, std::abs(x));
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (!(std::abs(k[i] - r[i]) <= rtol * std::abs(r[i]) + atol * scale + floor)) {
      return std::string(what) + "[" + std::to_string(i) + "]: kernel " + Num(k[i]) + ", oracle " +
             Num(r[i]) + " (of " + std::to_string(r.size()) + ")";
    }
  }
  return "";
}

// Runs `steps` calls over every shape (two groups, alternating; different step counts), checking
// each against the oracle: f32 storage free running over all steps, 16-bit storage per step.
void RunAdafactorSweep(const std::vector<AdafactorHyper>& groups, const Combo& c, int steps,
                       int threads, bool unaligned, bool fma) {
  Rng rng(2026);
  std::vector<AdafactorCase> cases;
  cases.reserve(AdafactorShapes().size());
  std::uint32_t k = 0;
  for (const AdafactorShape& sh : AdafactorShapes()) {
    cases.emplace_back(sh, c, k % 2, k % 3 == 0 ? 1 : 4 + k, unaligned, rng);
    ++k;
  }
  const bool exact_storage = (c.param == kF32 || c.master) && c.state == kF32;
  const double widen = fma ? 1.0 : 10.0;
  Runtime runtime(threads);
  for (int step = 0; step < steps; ++step) {
    std::vector<Segment> segments;
    for (AdafactorCase& a : cases) {
      a.NewGrad(rng, step % 2 == 0 ? 1.0 : 1e-3);
      if (!exact_storage) a.SyncOracle();
      segments.push_back(a.MakeSegment(c));
    }
    AdafactorStep(groups, segments, runtime);
    for (AdafactorCase& a : cases) {
      a.OracleStep(groups[a.group]);
      ++a.step;
      // f32 storage: the norms and factors round to f32 along the way (rtol over a few steps);
      // 16-bit storage: two ulps of the type.
      const double rtol16 = c.state == kBF16 || c.param == kBF16 ? 1.6e-2 : 2e-3;
      const double rtol_p = (exact_storage || c.master ? 2e-5 : rtol16) * widen;
      const double rtol_s = (c.state == kF32 ? 2e-5 : rtol16) * widen;
      const std::string where = DescribeAdafactor(groups[a.group]) + ", " + ComboName(c) +
                                ", shape " + std::to_string(a.shape.rows) + "x" +
                                std::to_string(a.shape.cols) + " numel " +
                                std::to_string(a.shape.numel) + ", call " + std::to_string(step);
      const std::vector<double> kp = a.master ? a.master->ToDouble() : a.param.ToDouble();
      EXPECT_EQ(CompareAdafactor("param", kp, a.p, rtol_p, 8 * FLT_EPSILON * widen), "") << where;
      // f16 states of tiny gradients are subnormal: half their spacing (2^-25) absolute
      const double floor = c.state == kF16 ? 0x1p-25 : 0.0;
      EXPECT_EQ(CompareAdafactor("row_var", a.row_var.ToDouble(), a.rv, rtol_s, 0.0, floor), "")
          << where;
      EXPECT_EQ(CompareAdafactor("col_var", a.col_var.ToDouble(), a.cv, rtol_s, 0.0, floor), "")
          << where;
      EXPECT_EQ(CompareAdafactor("variance", a.variance.ToDouble(), a.var, rtol_s, 0.0, floor), "")
          << where;
      if (a.master) {  // the 16-bit param is the rounding of the master
        for (std::size_t i = 0; i < a.shape.numel; ++i) {
          ASSERT_EQ(a.param.Get(i),
                    static_cast<double>(c.param == kBF16 ? BF16ToF32(F32ToBF16(a.master->F32(i)))
                                                         : F16ToF32(F32ToF16(a.master->F32(i)))))
              << where << " element " << i;
        }
      }
      for (const Buffer* b : {&a.param, &a.grad, &a.row_var, &a.col_var, &a.variance}) {
        ASSERT_TRUE(b->GuardsIntact()) << where;
      }
    }
  }
}

class AdafactorKernel : public TargetTest {};

TEST_P(AdafactorKernel, Sweep) {
  const std::vector<Combo> combos = {
      Combo{kF32, kF32, kF32},  Combo{kBF16, kBF16, kBF16},      Combo{kF16, kF16, kF32},
      Combo{kF32, kF32, kBF16}, Combo{kBF16, kBF16, kF32, true}, Combo{kF16, kF32, kF16, true}};
  const int steps = SmallOnly() ? 2 : 4;
  for (const AdafactorHyper& h : AdafactorOptions()) {
    for (const Combo& c : combos) {
      for (const int threads : {1, 3}) {
        RunAdafactorSweep({h, AdafactorOtherGroup(h)}, c, steps, threads, threads == 3,
                          IsFmaTarget(target()));
      }
    }
  }
}

// Runtime(1), (2) and (3) give the same bits, over shapes of many tiles.
std::vector<std::vector<std::uint8_t>> AdafactorRun(int threads, const Combo& c) {
  Rng rng(99);
  const std::vector<AdafactorHyper> groups = {AdafactorHyper{.weight_decay = 0.01},
                                              AdafactorHyper{.lr = 0.5, .maximize = true}};
  std::vector<AdafactorCase> cases;
  const std::vector<AdafactorShape> shapes = {{0, 0, 100003},     {3, 9000, 27000},
                                              {2000, 70, 140000}, {30, 50, 4 * 1500},
                                              {1, 1, 70000},      {3, 3, 9 * 4000}};
  cases.reserve(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    cases.emplace_back(shapes[i], c, static_cast<std::uint32_t>(i % 2), 1, false, rng);
  }
  Runtime runtime(threads);
  for (int step = 0; step < 3; ++step) {
    std::vector<Segment> segments;
    for (AdafactorCase& a : cases) {
      a.NewGrad(rng, 1.0);
      segments.push_back(a.MakeSegment(c));
      ++a.step;
    }
    AdafactorStep(groups, segments, runtime);
  }
  std::vector<std::vector<std::uint8_t>> out;
  for (AdafactorCase& a : cases) {
    for (const Buffer* b : {&a.param, &a.row_var, &a.col_var, &a.variance}) {
      const auto* bytes = static_cast<const std::uint8_t*>(b->data());
      out.emplace_back(bytes, bytes + b->num_bytes());
    }
    if (a.master) {
      const auto* bytes = static_cast<const std::uint8_t*>(a.master->data());
      out.emplace_back(bytes, bytes + a.master->num_bytes());
    }
  }
  return out;
}

TEST_P(AdafactorKernel, Determinism) {
  for (const Combo& c : {Combo{kF32, kF32, kF32}, Combo{kBF16, kBF16, kBF16, true}}) {
    const auto one = AdafactorRun(1, c);
    EXPECT_TRUE(one == AdafactorRun(2, c)) << ComboName(c) << ": Runtime(2) differs from (1)";
    EXPECT_TRUE(one == AdafactorRun(3, c)) << ComboName(c) << ": Runtime(3) differs from (1)";
  }
}

// Targets of one class (FMA: AVX2 and up; the others) give the same bits: the sums never depend on
// the vector width.
TEST(DeterminismAcrossTargets, Adafactor) {
  test::TargetGuard guard;
  for (const Combo& c : {Combo{kF32, kF32, kF32}, Combo{kF16, kF16, kF32, true}}) {
    std::optional<std::pair<std::string, std::vector<std::vector<std::uint8_t>>>> first[2];
    const std::vector<std::string> targets = AvailableTargets();
    for (std::size_t ti = 0; ti < targets.size(); ++ti) {
      ForceTarget(targets[ti]);
      auto run = AdafactorRun(static_cast<int>(ti % 3) + 1, c);
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

INSTANTIATE_TEST_SUITE_P(Targets, AdafactorKernel, ::testing::ValuesIn(AvailableTargets()),
                         TargetParamName);

}  // namespace
}  // namespace fusedopt
