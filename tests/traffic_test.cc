// The traffic kernels of the benchmark's ceiling (src/baselines/same_traffic.h) touch exactly the
// bytes they claim: with c = 1 every written array must hold x + g over its whole range and nothing
// else, for every param (and state) dtype, grad dtype, state count and loop (store kind, pace), on
// every SIMD target; and the STREAM-style fill, copy and read cover every element. Sizes and
// offsets make pieces that start unaligned, cross chunk edges and end in a tail. With 8-bit states
// (u8 codes, an f32 absmax per 256-element block) c = 0 leaves every byte as it was, and c = 1
// writes every code and absmax once and nothing beside them.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/quantize.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/baselines/same_traffic.h"
#include "src/baselines/standard.h"
#include "tests/test_support.h"

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
    return static_cast<float>((i * 7 + std::size_t{seed} * 13) % 32);
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

// A buffer of n elements of elem_size bytes, `offset` elements past a 64-byte boundary, between
// kPad guard bytes on each side; every byte starts arbitrary, so that a snapshot shows what a
// kernel wrote.
class Guarded {
 public:
  static constexpr std::size_t kPad = 64;
  Guarded(std::size_t n, std::size_t elem_size, std::size_t offset)
      : begin_(kPad + offset * elem_size), bytes_(n * elem_size) {
    auto x = static_cast<std::uint32_t>(n * 2654435761u + offset);
    for (std::byte& b : storage_) {
      x = x * 1664525u + 1013904223u;
      b = static_cast<std::byte>(x >> 24);
    }
  }
  void* data() { return storage_.data() + align() + begin_; }
  const std::vector<std::byte>& bytes() const { return storage_; }
  // Whether the bytes outside [data, data + n · elem_size) are those of `before`.
  bool GuardsAsIn(const std::vector<std::byte>& before) const {
    const std::size_t first = align() + begin_;
    return std::equal(storage_.begin(), storage_.begin() + static_cast<std::ptrdiff_t>(first),
                      before.begin()) &&
           std::equal(storage_.begin() + static_cast<std::ptrdiff_t>(first + bytes_),
                      storage_.end(), before.begin() + static_cast<std::ptrdiff_t>(first + bytes_));
  }

 private:
  std::size_t align() const {
    return (64 - reinterpret_cast<std::uintptr_t>(storage_.data()) % 64) % 64;
  }
  std::size_t begin_;
  std::size_t bytes_;
  std::vector<std::byte> storage_ = std::vector<std::byte>(begin_ + bytes_ + kPad + 64);
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
          arrays.reserve(std::size_t{2} * (2 + kMaxStates));
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

// 8-bit states: per element each state's u8 code, per 256-element block its f32 absmax. With c = 0
// every byte of every buffer stays as it was; with c = 1 the param holds x + g, each code its value
// + g and each absmax twice its value, over exactly their ranges. Two chunks, one per thread: the
// second segment runs from inside chunk 0 into chunk 1, whose edge cuts its block 10 (element
// 2768): that block's absmax is the first thread's to move, block 11's the second's.
TEST_P(Traffic, Q8StepKeepsEveryByteWithCZeroAndWritesEachCodeAndAbsmaxOnce) {
  const ForcedTarget target(GetParam());
  const Runtime runtime(2);
  const std::size_t sizes[] = {30000, 20000};
  static_assert(kGrainElements == 32768);
  const auto code = [](std::size_t i, int j) {
    return static_cast<std::uint8_t>((i * 5 + static_cast<std::size_t>(j) * 11) % 64);
  };
  const auto absmax = [](std::size_t b, int j) {
    return static_cast<float>((b * 3 + static_cast<std::size_t>(j)) % 50 + 1);
  };
  const std::pair<DType, DType> dtypes[] = {{DType::kF32, DType::kF32},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kF16, DType::kF16},
                                            {DType::kF32, DType::kBF16}};
  for (const auto& [p, g] : dtypes) {
    for (int states = 1; states <= kMaxStates; ++states) {
      for (const TrafficLoop loop : kAllTrafficLoops) {
        SCOPED_TRACE(std::string(DTypeName(p)) + " param, " + std::string(DTypeName(g)) +
                     " grad, 8-bit states x" + std::to_string(states) + ", " +
                     TrafficLoopName(loop));
        std::vector<Guarded> buffers;  // per segment: param, grad, then codes and absmax per state
        buffers.reserve(std::size_t{2} * (2 + 2 * kMaxStates));
        std::vector<Segment> segments;
        for (std::size_t k = 0; k < 2; ++k) {
          const std::size_t n = sizes[k];
          Segment seg;
          seg.param = buffers.emplace_back(n, DTypeSize(p), k).data();
          seg.grad = buffers.emplace_back(n, DTypeSize(g), 3).data();
          seg.numel = n;
          seg.param_dtype = p;
          seg.grad_dtype = g;
          seg.state_dtype = DType::kQ8;
          for (std::size_t i = 0; i < n; ++i) {
            StoreFromF32(seg.param, p, i, Array::Pattern(i, 1));
            StoreFromF32(const_cast<void*>(seg.grad), g, i, Array::Pattern(i, 2));
          }
          // States in the last slots; the first state's codes as aligned as the param.
          for (int j = 0; j < states; ++j) {
            const int slot = kMaxStates - states + j;
            auto* codes = static_cast<std::uint8_t*>(
                buffers.emplace_back(n, 1, k + static_cast<std::size_t>(j)).data());
            auto* scales = static_cast<float*>(
                buffers.emplace_back(NumQuantBlocks(n), 4, static_cast<std::size_t>(j) + 1).data());
            for (std::size_t i = 0; i < n; ++i) codes[i] = code(i, j);
            for (std::size_t b = 0; b < NumQuantBlocks(n); ++b) scales[b] = absmax(b, j);
            seg.state[slot] = codes;
            seg.absmax[slot] = scales;
          }
          segments.push_back(seg);
        }
        std::vector<std::vector<std::byte>> before;
        before.reserve(buffers.size());
        for (const Guarded& b : buffers) before.push_back(b.bytes());
        SameTrafficStep(segments, runtime, loop, 0.0f);
        for (std::size_t b = 0; b < buffers.size(); ++b)
          EXPECT_TRUE(buffers[b].bytes() == before[b]) << "c = 0 changed buffer " << b;

        SameTrafficStep(segments, runtime, loop, 1.0f);
        for (std::size_t b = 0; b < buffers.size(); ++b)
          EXPECT_TRUE(buffers[b].GuardsAsIn(before[b])) << "c = 1 wrote beside buffer " << b;
        for (std::size_t k = 0; k < 2; ++k) {
          const Segment& seg = segments[k];
          bool ok = true;
          for (std::size_t i = 0; i < seg.numel && ok; ++i) {
            const float gi = Array::Pattern(i, 2);
            ok = LoadAsF32(seg.grad, g, i) == gi &&
                 LoadAsF32(seg.param, p, i) == Array::Pattern(i, 1) + gi;
            for (int j = 0; j < states && ok; ++j) {
              const auto* codes =
                  static_cast<const std::uint8_t*>(seg.state[kMaxStates - states + j]);
              ok = static_cast<float>(codes[i]) == static_cast<float>(code(i, j)) + gi;
            }
            EXPECT_TRUE(ok) << "segment " << k << ", element " << i;
          }
          for (int j = 0; j < states; ++j) {
            const float* scales = seg.absmax[kMaxStates - states + j];
            for (std::size_t b = 0; b < NumQuantBlocks(seg.numel); ++b) {
              ASSERT_EQ(scales[b], 2.0f * absmax(b, j))
                  << "segment " << k << ", state " << j << ", block " << b;
            }
          }
        }
      }
    }
  }
}

// 8-bit states need every allocated state's absmax: without, nothing is touched. A reduction
// reads each code and the absmax of each block once (its sum over zero params and grads is theirs)
// and writes nothing.
TEST(TrafficSegments, Q8StatesNeedTheirAbsmaxAndAReductionReadsEachOnce) {
  const Runtime runtime(1);
  const std::size_t n = 300;
  Array param(DType::kF32, n, 0);
  Array grad(DType::kF32, n, 0);
  param.FillPattern(1);
  grad.FillPattern(2);
  std::vector<std::uint8_t> codes(n, 7);
  std::vector<float> scales(NumQuantBlocks(n), 3.0f);
  Segment q8;
  q8.param = param.data();
  q8.grad = grad.data();
  q8.numel = n;
  q8.state_dtype = DType::kQ8;
  q8.state[1] = codes.data();
  q8.absmax[1] = scales.data();
  Segment no_absmax = q8;
  no_absmax.absmax[1] = nullptr;
  EXPECT_THROW(SameTrafficStep({&no_absmax, 1}, runtime, TrafficLoop{}, 1.0f),
               std::invalid_argument);
  EXPECT_THROW(SameTrafficReduce({&no_absmax, 1}, runtime), std::invalid_argument);
  std::vector<float> zeros(n, 0.0f);
  Segment read = q8;
  read.param = zeros.data();
  read.grad = zeros.data();
  EXPECT_EQ(SameTrafficReduce({&read, 1}, runtime),
            7.0f * static_cast<float>(n) + 3.0f * static_cast<float>(NumQuantBlocks(n)));
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(param.Get(i), Array::Pattern(i, 1)) << i;
    ASSERT_EQ(codes[i], 7) << i;
  }
  for (const float a : scales) ASSERT_EQ(a, 3.0f);
  // With its absmax the step runs: code 7 + g, absmax 3 + 3.
  SameTrafficStep({&q8, 1}, runtime, TrafficLoop{}, 1.0f);
  EXPECT_EQ(codes[5], 7 + static_cast<int>(Array::Pattern(5, 2)));
  EXPECT_EQ(scales[1], 6.0f);
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

INSTANTIATE_TEST_SUITE_P(Targets, Traffic, ::testing::ValuesIn(test::KernelTargets()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace fusedopt::baselines
