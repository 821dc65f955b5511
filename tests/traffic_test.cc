// The traffic kernels of the benchmark's ceiling (src/baselines/same_traffic.h) touch exactly the
// bytes they claim: with c = 1 every written array must hold x + g over its whole range and nothing
// else, for every param (and state) dtype, grad dtype, state count and loop (store kind, pace), on
// every SIMD target; and the STREAM-style fill, copy and read cover every element. Sizes and
// offsets make pieces that start unaligned, cross chunk edges and end in a tail.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/baselines/same_traffic.h"
#include "src/baselines/standard.h"

namespace fusedopt::baselines {
namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

struct ForcedTarget {
  explicit ForcedTarget(const std::string& name) { ForceTarget(name); }
  ForcedTarget(const ForcedTarget&) = delete;
  ForcedTarget& operator=(const ForcedTarget&) = delete;
  ~ForcedTarget() { ForceTarget(""); }
};

// One array of n elements of a dtype, `offset` elements past a 64-byte boundary, padded with a
// guard value on both sides that no kernel may write.
class Array {
 public:
  static constexpr std::size_t kPad = 64;
  static constexpr float kGuard = -77.0f;
  Array(DType dtype, std::size_t n, std::size_t offset)
      : dtype_(dtype), n_(n), offset_(offset), bytes_((n + offset + 2 * kPad) * 4 + 64) {
    for (std::size_t i = 0; i < n_ + offset_ + 2 * kPad; ++i)
      StoreFromF32(base(), dtype_, i, kGuard);
  }
  void* data() { return static_cast<std::byte*>(base()) + (kPad + offset_) * DTypeSize(dtype_); }
  float Get(std::size_t i) { return LoadAsF32(data(), dtype_, i); }
  // Small whole numbers: exact in every dtype, and so are their sums below.
  static float Pattern(std::size_t i, std::uint32_t seed) {
    return static_cast<float>((i * 7 + seed * 13) % 32);
  }
  void FillPattern(std::uint32_t seed) {
    for (std::size_t i = 0; i < n_; ++i) StoreFromF32(data(), dtype_, i, Pattern(i, seed));
  }
  bool GuardsIntact() {
    const auto* b = static_cast<const std::byte*>(base());
    for (std::size_t i = 0; i < kPad + offset_; ++i)
      if (LoadAsF32(b, dtype_, i) != kGuard) return false;
    for (std::size_t i = kPad + offset_ + n_; i < n_ + offset_ + 2 * kPad; ++i)
      if (LoadAsF32(b, dtype_, i) != kGuard) return false;
    return true;
  }

 private:
  void* base() {
    const auto p = reinterpret_cast<std::uintptr_t>(storage_.data());
    return storage_.data() + ((64 - p % 64) % 64);
  }
  DType dtype_;
  std::size_t n_;
  std::size_t offset_;
  std::size_t bytes_;
  std::vector<std::byte> storage_ = std::vector<std::byte>(bytes_);
};

class Traffic : public ::testing::TestWithParam<std::string> {};

TEST_P(Traffic, StepWritesXPlusGradOnEveryWrittenArray) {
  const ForcedTarget target(GetParam());
  const Runtime runtime(2);
  // Two segments: the first crosses a chunk edge; the second starts inside that chunk.
  const std::size_t sizes[] = {kGrainElements + 37, 1000};
  for (const DType p : kDTypes) {
    for (const DType g : kDTypes) {
      for (int states = 0; states <= kMaxStates; ++states) {
        for (const TrafficLoop loop : kAllTrafficLoops) {
          SCOPED_TRACE(std::string(DTypeName(p)) + " param and states x" + std::to_string(states) +
                       ", " + std::string(DTypeName(g)) + " grad, " + TrafficLoopName(loop));
          std::vector<Array> arrays;
          arrays.reserve(2 * (2 + kMaxStates));
          std::vector<Segment> segments;
          for (std::size_t k = 0; k < 2; ++k) {
            const std::size_t n = sizes[k];
            // Different offsets per array: some pieces can stream, some cannot align at all.
            Array& pa = arrays.emplace_back(p, n, k + 1);
            Array& ga = arrays.emplace_back(g, n, 3);
            Segment seg;
            seg.param = pa.data();
            seg.grad = ga.data();
            seg.numel = n;
            seg.param_dtype = p;
            seg.grad_dtype = g;
            seg.state_dtype = p;
            pa.FillPattern(1);
            ga.FillPattern(2);
            // States in the last slots, so the kernel must find them, not assume slot 0.
            for (int j = 0; j < states; ++j) {
              Array& sa = arrays.emplace_back(p, n, static_cast<std::size_t>(j) + 1);
              sa.FillPattern(4 + static_cast<std::uint32_t>(j));
              seg.state[kMaxStates - states + j] = sa.data();
            }
            segments.push_back(seg);
          }
          SameTrafficStep(segments, runtime, loop, 1.0f);
          std::size_t a = 0;
          for (std::size_t k = 0; k < 2; ++k) {
            Array& pa = arrays[a];
            Array& ga = arrays[a + 1];
            bool ok = true;
            for (std::size_t i = 0; i < sizes[k] && ok; ++i) {
              const float gi = Array::Pattern(i, 2);
              ok = ga.Get(i) == gi && pa.Get(i) == Array::Pattern(i, 1) + gi;
              for (int j = 0; j < states && ok; ++j) {
                ok = arrays[a + 2 + static_cast<std::size_t>(j)].Get(i) ==
                     Array::Pattern(i, 4 + static_cast<std::uint32_t>(j)) + gi;
              }
              EXPECT_TRUE(ok) << "segment " << k << ", element " << i;
            }
            for (std::size_t j = 0; j < 2 + static_cast<std::size_t>(states); ++j)
              EXPECT_TRUE(arrays[a + j].GuardsIntact()) << "segment " << k << ", array " << j;
            a += 2 + static_cast<std::size_t>(states);
          }
        }
      }
    }
  }
}

// The loops exist for states in the param's dtype without master: anything else is refused before
// a byte is touched.
TEST(TrafficSegments, OtherStateDTypesAndMastersAreRefusedUntouched) {
  const Runtime runtime(1);
  const std::size_t n = 100;
  Array param(DType::kBF16, n, 0);
  Array grad(DType::kBF16, n, 0);
  Array state(DType::kF32, n, 0);
  Array master(DType::kF32, n, 0);
  param.FillPattern(1);
  grad.FillPattern(2);
  state.FillPattern(3);
  master.FillPattern(4);
  Segment ok;
  ok.param = param.data();
  ok.grad = grad.data();
  ok.numel = n;
  ok.param_dtype = ok.grad_dtype = DType::kBF16;
  ok.state_dtype = DType::kF32;  // no states allocated: the dtype does not matter
  Segment f32_states = ok;
  f32_states.state[0] = state.data();
  Segment with_master = ok;
  with_master.state_dtype = DType::kBF16;
  with_master.master = static_cast<float*>(master.data());
  for (const Segment& bad : {f32_states, with_master}) {
    const Segment segments[] = {ok, bad};
    EXPECT_THROW(SameTrafficStep(segments, runtime, TrafficLoop{}, 1.0f), std::invalid_argument);
    EXPECT_THROW(SameTrafficReduce(segments, runtime), std::invalid_argument);
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(param.Get(i), Array::Pattern(i, 1)) << i;
    ASSERT_EQ(state.Get(i), Array::Pattern(i, 3)) << i;
    ASSERT_EQ(master.Get(i), Array::Pattern(i, 4)) << i;
  }
  // A pace below 0, or with non-temporal stores, is refused too.
  for (const TrafficLoop bad :
       {TrafficLoop{TrafficStores::kRegular, -1}, TrafficLoop{TrafficStores::kStream, 2}}) {
    EXPECT_THROW(SameTrafficStep({&ok, 1}, runtime, bad, 1.0f), std::invalid_argument);
  }
  EXPECT_THROW(SameTrafficReduce({&ok, 1}, runtime, -1), std::invalid_argument);
  EXPECT_THROW(SameTrafficGradRead({&ok, 1}, runtime, -1), std::invalid_argument);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(param.Get(i), Array::Pattern(i, 1)) << i;
  // The one without states runs.
  SameTrafficStep({&ok, 1}, runtime, TrafficLoop{}, 1.0f);
  EXPECT_EQ(param.Get(5), Array::Pattern(5, 1) + Array::Pattern(5, 2));
}

TEST_P(Traffic, FillCopyAndReadCoverEveryElement) {
  const ForcedTarget target(GetParam());
  const Runtime runtime(2);
  for (const std::size_t offset : {0, 3}) {
    for (const TrafficStores stores : kAllTrafficStores) {
      SCOPED_TRACE("offset " + std::to_string(offset) + ", " + TrafficStoresName(stores));
      const std::size_t n = 3 * kGrainElements + 5;
      Array a(DType::kF32, n, offset);
      Array b(DType::kF32, n, 1);
      a.FillPattern(0);
      TrafficFill(static_cast<float*>(b.data()), n, 5.0f, runtime, stores);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(b.Get(i), 5.0f) << i;
      TrafficCopy(static_cast<const float*>(a.data()), static_cast<float*>(b.data()), n, runtime,
                  stores);
      double sum = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b.Get(i), a.Get(i)) << i;
        sum += a.Get(i);
      }
      EXPECT_TRUE(a.GuardsIntact());
      EXPECT_TRUE(b.GuardsIntact());
      EXPECT_EQ(TrafficRead(static_cast<const float*>(a.data()), n, runtime), sum);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, Traffic, ::testing::ValuesIn(AvailableTargets()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace fusedopt::baselines
