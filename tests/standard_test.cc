// The `standard` baseline (src/baselines/standard.h: each descriptor's StandardStep run as
// elementary f32 passes) against the double-precision oracle (tests/reference/reference.h), for
// every algorithm of the registry and hyper-parameters that reach each of its modes: three steps
// over segments that cross ATen's grain (so the ops are split over threads) and a tiny one. LAMB's
// global gradient clipping, which the standard step does itself, is applied to the oracle's
// gradients here, in double.

#include "src/baselines/standard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/optimizer.h"
#include "src/algos/registry.h"
#include "tests/reference/reference.h"

namespace fusedopt::baselines {
namespace {

using StateSpans = std::array<std::span<double>, kMaxStates>;

// The oracle's step of one tensor (LAMB: on the already clipped gradient).
void RefStep(const SgdHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::SgdStep(h, t, p, g, s[kMomentumBuffer]);
}
void RefStep(const AdamHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::AdamStep(h, t, p, g, s[kExpAvg], s[kExpAvgSq], s[kMaxExpAvgSq]);
}
void RefStep(const AdamWHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  RefStep(h.ToAdam(), t, p, g, s);
}
void RefStep(const RmspropHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::RmspropStep(h, t, p, g, s[kSquareAvg], s[kRmspropMomentumBuffer], s[kGradAvg]);
}
void RefStep(const AdagradHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::AdagradStep(h, t, p, g, s[kSum]);
}
void RefStep(const LionHyper& h, std::int64_t /*t*/, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::LionStep(h, p, g, s[kLionExpAvg]);
}
void RefStep(const AdamaxHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::AdamaxStep(h, t, p, g, s[kAdamaxExpAvg], s[kExpInf]);
}
void RefStep(const AdadeltaHyper& h, std::int64_t /*t*/, std::span<double> p,
             std::span<const double> g, const StateSpans& s) {
  ref::AdadeltaStep(h, p, g, s[kAdadeltaSquareAvg], s[kAccDelta]);
}
void RefStep(const RadamHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::RadamStep(h, t, p, g, s[kRadamExpAvg], s[kRadamExpAvgSq]);
}
void RefStep(const NadamHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::NadamStep(h, t, p, g, s[kNadamExpAvg], s[kNadamExpAvgSq]);
}
void RefStep(const RmsproptfHyper& h, std::int64_t /*t*/, std::span<double> p,
             std::span<const double> g, const StateSpans& s) {
  ref::RmsproptfStep(h, p, g, s[kRmsproptfSquareAvg], s[kRmsproptfMomentumBuffer],
                     s[kRmsproptfGradAvg]);
}
void RefStep(const AsgdHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::AsgdStep(h, t, p, g, s[kAsgdAx]);
}
void RefStep(const RpropHyper& h, std::int64_t /*t*/, std::span<double> p,
             std::span<const double> g, const StateSpans& s) {
  ref::RpropStep(h, p, g, s[kRpropPrev], s[kRpropStepSize]);
}
void RefStep(const BertAdamHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::BertAdamStep(h, t, 1.0, p, g, s[kBertAdamExpAvg], s[kBertAdamExpAvgSq]);  // g: clipped
}
void RefStep(const LambHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::LambStep(h, t, p, g, s[kLambExpAvg], s[kLambExpAvgSq]);
}
void RefStep(const LarsHyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
             const StateSpans& s) {
  ref::LarsStep(h, t, p, g, s[kLarsMomentumBuffer]);
}

// Hyper-parameter sets reaching every mode of the standard step.
std::vector<SgdHyper> Options(std::type_identity<SgdHyper> /*tag*/) {
  std::vector<SgdHyper> out;
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
template <class Hyper>
std::vector<Hyper> AdamOptions() {
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
std::vector<AdamHyper> Options(std::type_identity<AdamHyper> /*tag*/) {
  return AdamOptions<AdamHyper>();
}
std::vector<AdamWHyper> Options(std::type_identity<AdamWHyper> /*tag*/) {
  return AdamOptions<AdamWHyper>();
}
std::vector<RmspropHyper> Options(std::type_identity<RmspropHyper> /*tag*/) {
  std::vector<RmspropHyper> out;
  for (bool centered : {false, true}) {
    for (double momentum : {0.0, 0.9}) {
      for (double wd : {0.0, 0.01}) {
        out.push_back({.lr = 0.01,
                       .weight_decay = wd,
                       .momentum = momentum,
                       .centered = centered,
                       .maximize = centered && momentum != 0.0});
      }
    }
  }
  return out;
}
std::vector<AdagradHyper> Options(std::type_identity<AdagradHyper> /*tag*/) {
  std::vector<AdagradHyper> out;
  for (double lr_decay : {0.0, 0.01}) {
    for (double wd : {0.0, 0.01}) {
      for (bool maximize : {false, true})
        out.push_back({.lr_decay = lr_decay, .weight_decay = wd, .maximize = maximize});
    }
  }
  return out;
}
std::vector<LionHyper> Options(std::type_identity<LionHyper> /*tag*/) {
  std::vector<LionHyper> out;
  for (double wd : {0.0, 0.1}) {
    for (bool maximize : {false, true}) out.push_back({.weight_decay = wd, .maximize = maximize});
  }
  return out;
}
std::vector<AdamaxHyper> Options(std::type_identity<AdamaxHyper> /*tag*/) {
  std::vector<AdamaxHyper> out;
  for (double wd : {0.0, 0.01}) {
    for (bool maximize : {false, true})
      out.push_back({.lr = 0.01, .weight_decay = wd, .maximize = maximize});
  }
  return out;
}
std::vector<AdadeltaHyper> Options(std::type_identity<AdadeltaHyper> /*tag*/) {
  std::vector<AdadeltaHyper> out;
  for (double wd : {0.0, 0.01}) {
    for (bool maximize : {false, true})
      out.push_back({.lr = 0.5, .weight_decay = wd, .maximize = maximize});
  }
  return out;
}
std::vector<RadamHyper> Options(std::type_identity<RadamHyper> /*tag*/) {
  std::vector<RadamHyper> out;
  for (double wd : {0.0, 0.01}) {
    for (bool decoupled : {false, true}) {
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
std::vector<NadamHyper> Options(std::type_identity<NadamHyper> /*tag*/) {
  std::vector<NadamHyper> out;
  for (double wd : {0.0, 0.01}) {
    for (bool decoupled : {false, true}) {
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
// All 18 modes: weight decay {none, coupled, decoupled} × centered × momentum {none, lr in the
// buffer, lr on the step}.
std::vector<RmsproptfHyper> Options(std::type_identity<RmsproptfHyper> /*tag*/) {
  std::vector<RmsproptfHyper> out;
  for (int decay = 0; decay < 3; ++decay) {
    for (bool centered : {false, true}) {
      for (int mode = 0; mode < 3; ++mode) {
        out.push_back({.lr = 0.01,
                       .weight_decay = decay == 0 ? 0.0 : 0.01,
                       .momentum = mode == 0 ? 0.0 : 0.9,
                       .centered = centered,
                       .decoupled_decay = decay == 2,
                       .lr_in_momentum = mode != 2});
      }
    }
  }
  return out;
}

// t0 0: steps 1 and 2 copy the param into ax, step 3 averages.
std::vector<AsgdHyper> Options(std::type_identity<AsgdHyper> /*tag*/) {
  std::vector<AsgdHyper> out;
  for (double t0 : {1e6, 0.0}) {
    for (double wd : {0.0, 0.01}) {
      for (bool maximize : {false, true}) {
        out.push_back(
            {.lr = 0.05, .lambd = 0.01, .t0 = t0, .weight_decay = wd, .maximize = maximize});
      }
    }
  }
  return out;
}
std::vector<RpropHyper> Options(std::type_identity<RpropHyper> /*tag*/) {
  return {RpropHyper{}, RpropHyper{.maximize = true},
          RpropHyper{.lr = 0.05,
                     .etaminus = 0.25,
                     .etaplus = 1.5,
                     .step_size_min = 0.02,
                     .step_size_max = 0.06}};
}
// The reference's defaults (clipping at 1: the larger gradients only), no clipping and no decay,
// and each schedule.
std::vector<BertAdamHyper> Options(std::type_identity<BertAdamHyper> /*tag*/) {
  return {{.lr = 0.01},
          {.lr = 0.01, .weight_decay = 0.0, .max_grad_norm = -1.0},
          {.lr = 0.01, .warmup = 0.5, .t_total = 4},
          {.lr = 0.01, .warmup = 0.2, .t_total = 5, .schedule = kBertAdamWarmupConstant},
          {.lr = 0.01, .t_total = 5, .schedule = kBertAdamWarmupCosine},
          {.lr = 0.01, .t_total = 3, .schedule = kBertAdamWarmupPoly, .max_grad_norm = 0.5}};
}
std::vector<LambHyper> Options(std::type_identity<LambHyper> /*tag*/) {
  std::vector<LambHyper> out;
  for (int mode = 0; mode < 16; ++mode) {
    LambHyper h;
    h.weight_decay = (mode & 1) != 0 ? 0.0 : 0.01;
    h.adam_w_mode = (mode & 2) == 0;
    h.bias_correction = (mode & 4) == 0;
    h.grad_averaging = (mode & 8) == 0;
    h.use_nvlamb = mode == 1;
    out.push_back(h);
  }
  return out;
}

// Momentum modes × weight decay × clip and scale mode. LARC's local rate tc·‖θ‖/(‖g‖ + λ‖θ‖ + ε)
// is about 20 (gradients of ±1e-3) or 2 (±1e-2) without weight decay, so at lr 5 clip mode's
// min(rate / lr, 1) is 1 for the first and below 1 for the second.
std::vector<LarsHyper> Options(std::type_identity<LarsHyper> /*tag*/) {
  std::vector<LarsHyper> out;
  for (int mode = 0; mode < 4; ++mode) {
    for (double wd : {0.0, 0.01}) {
      for (bool clip : {true, false}) {
        out.push_back({.lr = 5.0,
                       .momentum = mode == 0 ? 0.0 : 0.9,
                       .dampening = mode == 2 ? 0.1 : 0.0,
                       .weight_decay = wd,
                       .nesterov = mode == 3,
                       .clip = clip});
      }
    }
  }
  return out;
}

// delta 10 (every channel view of the first tensor projected) and 0.1 (mostly none) × nesterov ×
// weight decay.
std::vector<AdampHyper> Options(std::type_identity<AdampHyper> /*tag*/) {
  std::vector<AdampHyper> out;
  for (double delta : {10.0, 0.1}) {
    for (bool nesterov : {false, true}) {
      for (double wd : {0.0, 0.1}) {
        out.push_back({.lr = 0.01, .weight_decay = wd, .delta = delta, .nesterov = nesterov});
      }
    }
  }
  return out;
}

// torch's defaults; a larger lr with weight decay, a larger eps1 and maximize; eps2 above the
// params' RMS (alpha's other branch) with d 0.5, so that the update's RMS is clipped.
std::vector<AdafactorHyper> Options(std::type_identity<AdafactorHyper> /*tag*/) {
  return {AdafactorHyper{},
          {.lr = 0.05, .eps1 = 1e-3, .weight_decay = 0.1, .maximize = true},
          {.beta2_decay = -0.5, .eps2 = 1.0, .d = 0.5}};
}

// The step of the first of the three: 1, except for RAdam, whose steps 1-5 are never rectified
// (rho_t <= 5 for any beta2): steps 5, 6 and 7 take both of its branches.
template <class Hyper>
std::int64_t FirstStep(const Hyper& /*h*/) {
  return 1;
}
std::int64_t FirstStep(const RadamHyper& /*h*/) { return 5; }

template <class Hyper>
std::string Describe(const Hyper& h) {
  std::ostringstream out;
  const auto fields = algos::DescriptorOf<Hyper>::kFields;
  std::apply([&](const auto&... f) { ((out << f.name << "=" << h.*f.member << " "), ...); },
             fields);
  return out.str();
}

// A state that holds a running sum or mean of squares, or a running max of magnitudes (never
// negative).
bool IsSumOfSquares(const std::string& state) {
  return state == "exp_avg_sq" || state == "max_exp_avg_sq" || state == "square_avg" ||
         state == "sum" || state == "exp_inf" || state == "acc_delta";
}

// Deterministic values in [lo, hi), exact in f32.
class Rng {
 public:
  explicit Rng(std::uint32_t seed) : state_(seed) {}
  float Uniform(float lo, float hi) {
    state_ = state_ * 1664525u + 1013904223u;
    return lo + (hi - lo) * static_cast<float>(state_ >> 8) / 16777216.0f;
  }

 private:
  std::uint32_t state_;
};

// Where the standard step's f32 value is not within tolerance of the oracle's: the first
// mismatches and their count. A step is about ten roundings per element, each op rounded to f32.
std::string Compare(std::span<const float> got, std::span<const double> want, double rtol) {
  double max_abs = 0.0;
  for (const double w : want) max_abs = std::max(max_abs, std::abs(w));
  const double atol = 1e-6 * max_abs;
  std::ostringstream out;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (err <= std::max(atol, rtol * std::abs(want[i]))) continue;
    if (++bad <= 5) out << "  i=" << i << " standard " << got[i] << " oracle " << want[i] << "\n";
  }
  if (bad != 0) out << "  " << bad << " of " << want.size() << " elements differ\n";
  return out.str();
}

// ::testing::Types of every descriptor of a registry list.
template <class L>
struct TypesOf;
template <class... A>
struct TypesOf<algos::List<A...>> {
  using type = ::testing::Types<A...>;
};

struct DescriptorName {
  template <class A>
  static std::string GetName(int /*i*/) {
    return A::kName;
  }
};

template <class A>
class StandardVsOracle : public ::testing::Test {};
TYPED_TEST_SUITE(StandardVsOracle, TypesOf<algos::All>::type, DescriptorName);

TYPED_TEST(StandardVsOracle, ThreeSteps) {
  using A = TypeParam;
  using Hyper = typename A::Hyper;
  const Runtime runtime(2);
  std::vector<TensorSpec> tensors = {{.numel = 2 * kGrainElements + 37}, {.numel = 5}};
  // AdamP: the first tensor has 23 channel rows of 2851 (65573 elements), the second one
  // dimension.
  if constexpr (std::is_same_v<Hyper, AdampHyper>) tensors[0].rows = 23;
  // Adafactor: vectors, and matrices (rows = size(-2), cols = size(-1)) of shapes [3, 70, 400]
  // (crosses the grain), [7, 5000] (column blocks with a remainder), [6, 5, 3, 3] and
  // [8, 4, 1, 1] (1×1 matrices).
  if constexpr (std::is_same_v<Hyper, AdafactorHyper>) {
    tensors.push_back({.numel = 3 * 70 * 400, .rows = 70, .cols = 400});
    tensors.push_back({.numel = 7 * 5000, .rows = 7, .cols = 5000});
    tensors.push_back({.numel = 6 * 5 * 3 * 3, .rows = 3, .cols = 3});
    tensors.push_back({.numel = 8 * 4, .rows = 1, .cols = 1});
  }
  constexpr int kSteps = 3;
  for (const Hyper& hyper : Options(std::type_identity<Hyper>{})) {
    // Gradients of global norm 0.15 and 1.5 (LAMB: below and above its clip at max_grad_norm 1).
    for (const float grad_scale : {1e-3f, 1e-2f}) {
      SCOPED_TRACE(Describe(hyper) + "grad scale " + std::to_string(grad_scale));
      BenchHyper h;
      h.Of<Hyper>() = hyper;
      const Algorithm a = tools::AlgorithmOf<A>();
      const unsigned slots = BenchRequiredStates(a, h);
      FlatStorage storage(tensors, 1, {}, slots);
      std::vector<Segment> segments(storage.segments().begin(), storage.segments().end());
      // The oracle's copies of every buffer, in double.
      std::vector<std::vector<double>> p(tensors.size());
      std::vector<std::vector<double>> g(tensors.size());
      std::vector<std::array<std::vector<double>, kMaxStates>> st(tensors.size());
      Rng rng(7);
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        for (float& x : storage.params<float>(i)) {
          x = rng.Uniform(-1.0f, 1.0f);
          p[i].push_back(x);
        }
        for (float& x : storage.grads<float>(i)) {
          x = rng.Uniform(-grad_scale, grad_scale);
          g[i].push_back(x);
        }
        for (int k = 0; k < kMaxStates; ++k) {
          if ((slots >> k & 1u) == 0) continue;
          // Sums of squares positive, above the square of any running mean (RMSprop's grad_avg).
          const bool squares = IsSumOfSquares(A::kStates[k]);
          for (float& x : storage.state<float>(i, k)) {
            x = squares ? rng.Uniform(0.5f, 1.0f) : rng.Uniform(-0.3f, 0.3f);
            // Adafactor's start as torch's, zeros: its first lerp weight is 1 (1^beta2_decay), so
            // a start value of another scale than g² would only cancel, in the oracle's
            // a + w·(b − a) with a rounding error of a's size.
            if constexpr (std::is_same_v<Hyper, AdafactorHyper>) x = 0.0f;
            st[i][k].push_back(x);
          }
        }
      }
      for (std::int64_t t = FirstStep(hyper); t < FirstStep(hyper) + kSteps; ++t) {
        for (Segment& s : segments) s.step = t;
        StandardStep(a, h, segments, runtime);
        // LAMB clips the gradients by their global norm first (tools/lamb_reference.py).
        std::vector<std::vector<double>> grads = g;
        if constexpr (std::is_same_v<Hyper, LambHyper>) {
          double total = 0.0;
          for (const auto& gi : g)
            for (const double x : gi) total += x * x;
          const double norm = std::sqrt(total);
          if (norm > h.standard.max_grad_norm) {
            for (auto& gi : grads)
              for (double& x : gi) x *= h.standard.max_grad_norm / norm;
          }
        }
        // BertAdam clips the gradients of each (group, dtype) buffer (here: all, one f32 group).
        if constexpr (std::is_same_v<Hyper, BertAdamHyper>) {
          double total = 0.0;
          for (const auto& gi : g)
            for (const double x : gi) total += x * x;
          const double clip = ref::BertAdamClip(hyper.max_grad_norm, total);
          for (auto& gi : grads)
            for (double& x : gi) x *= clip;
        }
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          StateSpans spans;
          for (int k = 0; k < kMaxStates; ++k) spans[k] = st[i][k];
          if constexpr (std::is_same_v<Hyper, AdampHyper>) {
            ref::AdampStep(hyper, t, tensors[i].rows, p[i], grads[i], spans[kAdampExpAvg],
                           spans[kAdampExpAvgSq]);
          } else if constexpr (std::is_same_v<Hyper, AdafactorHyper>) {
            const std::size_t rows = tensors[i].rows;
            const std::size_t cols = tensors[i].cols;
            const std::size_t batch = rows > 0 ? tensors[i].numel / (rows * cols) : 0;
            ref::AdafactorStep(
                hyper, t, rows, cols, p[i], grads[i], spans[kAdafactorRowVar].first(batch * rows),
                spans[kAdafactorColVar].first(batch * cols), spans[kAdafactorVariance]);
          } else {
            RefStep(hyper, t, p[i], grads[i], spans);
          }
        }
      }
      // Relative error grows with the steps and with cancellation in the states.
      const double rtol = 2e-5;
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        EXPECT_EQ(Compare(storage.params<float>(i), p[i], rtol), "") << "param of tensor " << i;
        for (int k = 0; k < kMaxStates; ++k) {
          if ((slots >> k & 1u) == 0) continue;
          EXPECT_EQ(Compare(storage.state<float>(i, k), st[i][k], rtol), "")
              << A::kStates[k] << " of tensor " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fusedopt::baselines
