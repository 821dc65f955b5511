// The `standard` baseline (src/baselines/standard.h: each descriptor's StandardStep run as
// elementary f32 passes) against the double-precision oracle (tests/reference/reference.h), for
// every algorithm of the registry and hyper-parameters that reach each of its modes: three steps
// over segments that cross ATen's grain (so the ops are split over threads) and a tiny one, plus
// the tensors an algorithm's cases add (tests/reference/<algo>.h, ref::KernelCases: options,
// shapes, first step). Gradient clipping that the standard step does itself is applied to the
// oracle's gradients by the cases' StandardClip, in double.

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
#include <vector>

#include "fusedopt/optimizer.h"
#include "src/algos/registry.h"
#include "tests/reference/reference.h"

namespace fusedopt::baselines {
namespace {

using ref::StateSpans;

// The standard step's options: the cases' own (tests/reference/<algo>.h), or the kernel sweep's.
template <class Cases>
std::vector<typename Cases::Hyper> Options() {
  if constexpr (requires { Cases::StandardOptions(); }) {
    return Cases::StandardOptions();
  } else {
    return Cases::Options();
  }
}

// The step of the first of the three: 1, unless the cases say otherwise (a branch taken only
// later).
template <class Cases>
std::int64_t FirstStep() {
  if constexpr (requires { Cases::kStandardFirstStep; }) {
    return Cases::kStandardFirstStep;
  } else {
    return 1;
  }
}

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
  using Cases = ref::KernelCases<Hyper>;
  std::vector<TensorSpec> tensors = {{.numel = 2 * kGrainElements + 37}, {.numel = 5}};
  if constexpr (requires { Cases::StandardTensors(tensors); }) Cases::StandardTensors(tensors);
  constexpr int kSteps = 3;
  for (const Hyper& hyper : Options<Cases>()) {
    // Gradients of global norm 0.15 and 1.5 (below and above a clip at max_grad_norm 1).
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
          // Sums of squares positive, above the square of any running mean (a centered grad_avg).
          const bool squares = IsSumOfSquares(A::kStates[k]);
          for (float& x : storage.state<float>(i, k)) {
            x = squares ? rng.Uniform(0.5f, 1.0f) : rng.Uniform(-0.3f, 0.3f);
            if constexpr (requires { Cases::kStandardZeroStates; }) x = 0.0f;
            st[i][k].push_back(x);
          }
        }
      }
      for (std::int64_t t = FirstStep<Cases>(); t < FirstStep<Cases>() + kSteps; ++t) {
        for (Segment& s : segments) s.step = t;
        StandardStep(a, h, segments, runtime);
        std::vector<std::vector<double>> grads = g;
        if constexpr (requires { Cases::StandardClip(hyper, h.standard, grads); }) {
          Cases::StandardClip(hyper, h.standard, grads);
        }
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          StateSpans spans;
          for (int k = 0; k < kMaxStates; ++k) spans[k] = st[i][k];
          if constexpr (requires { &Cases::ShapedRef; }) {
            Cases::ShapedRef(hyper, t, tensors[i].rows, tensors[i].cols, p[i], grads[i], spans);
          } else {
            Cases::Ref(hyper, t, p[i], grads[i], spans);
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
