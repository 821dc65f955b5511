// Sign descent's kernel: Io + SignDescentMath for every dtype combination, compiled for every SIMD
// target, and its step, the engine's generic one. Test-only (tests/algos/sign_descent.h).

#include "tests/algos/sign_descent.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/algos/sign_descent.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "tests/algos/sign_descent_math.h"

void SignDescentChunks(const StepPlan<test_algos::SignDescentScalars>& plan,
                       std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const test_algos::SignDescentScalars s, std::size_t begin,
                   std::size_t end) HWY_ATTR {
                  WithFlags(
                      [&](auto decay) HWY_ATTR {
                        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                          auto p = b.param.Load(d, i);
                          SignDescentMath<decltype(decay)::value>(HwyOps<decltype(d)>{d}, s, p,
                                                                  b.Grad(d, i));
                          b.param.Store(d, p, i);
                        });
                      },
                      s.decay);
                });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#  include "src/core/run_step.h"

namespace fusedopt {
HWY_EXPORT(SignDescentChunks);
void test_algos::RunSignDescentChunks(const StepPlan<test_algos::SignDescentScalars>& plan,
                                      std::size_t chunk_begin, std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(SignDescentChunks)(plan, chunk_begin, chunk_end);
}

template <>
void FusedStep<test_algos::SignDescentHyper>(std::span<const test_algos::SignDescentHyper> groups,
                                             std::span<const Segment> segments, Runtime& runtime) {
  RunStep<test_algos::SignDescent>(groups, segments, runtime);
}
template <>
unsigned RequiredStates<test_algos::SignDescentHyper>(const test_algos::SignDescentHyper& h) {
  return test_algos::SignDescent::RequiredStates(h);
}
}  // namespace fusedopt
#endif
