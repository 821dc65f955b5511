// The C++ Optimizer layer (optimizer.h): FlatStorage's layout, and Optimizer<Hyper>'s wiring of the
// raw step functions (per-tensor step counts, state slots, groups, live hyper-parameters, master
// weights, threads).

#include "fusedopt/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
#include "fusedopt/quantize.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "tests/hyper_types.h"
#include "tests/reference/reference.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

using Bytes = std::vector<std::byte>;

Bytes Copy(const void* data, std::size_t bytes) {
  Bytes out(bytes);
  if (bytes != 0) std::memcpy(out.data(), data, bytes);
  return out;
}

bool SameBytes(const void* a, const void* b, std::size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

float Value(unsigned seed, std::size_t i) { return test::HashedValue(seed, i); }

std::uintptr_t Address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Writes uniform values in [lo, hi) into n elements of a buffer of dtype t.
void FillRandom(void* data, DType t, std::size_t n, std::mt19937& rng, float lo = -1.0f,
                float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::size_t i = 0; i < n; ++i) StoreFromF32(data, t, i, dist(rng));
}

// Everything an optimizer owns for one tensor, copied out: param, grad, each state slot, master.
struct TensorBytes {
  Bytes param, grad, master;
  std::array<Bytes, kMaxStates> state;
  bool operator==(const TensorBytes&) const = default;
};

// Failure messages show sizes and a hash of each buffer rather than the raw struct.
std::uint64_t Fnv1a(const Bytes& b) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::byte x : b) h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
  return h;
}

void PrintTo(const TensorBytes& t, std::ostream* os) {
  const auto field = [&](const char* name, const Bytes& b) {
    *os << name << "[" << b.size() << " B, fnv " << std::hex << Fnv1a(b) << std::dec << "] ";
  };
  field("param", t.param);
  field("grad", t.grad);
  field("master", t.master);
  for (int k = 0; k < kMaxStates; ++k) field("state", t.state[k]);
}

TensorBytes Capture(const Segment& s) {
  TensorBytes out;
  out.param = Copy(s.param, s.numel * DTypeSize(s.param_dtype));
  out.grad = Copy(s.grad, s.numel * DTypeSize(s.grad_dtype));
  if (s.master != nullptr) out.master = Copy(s.master, s.numel * sizeof(float));
  for (int k = 0; k < kMaxStates; ++k) {
    if (s.state[k] != nullptr) out.state[k] = Copy(s.state[k], s.numel * DTypeSize(s.state_dtype));
  }
  return out;
}

template <class Hyper>
std::vector<TensorBytes> CaptureAll(Optimizer<Hyper>& opt) {
  std::vector<TensorBytes> out;
  for (const Segment& s : opt.storage().segments()) out.push_back(Capture(s));
  return out;
}

template <class Hyper>
std::vector<std::int64_t> StepCounts(const Optimizer<Hyper>& opt, std::size_t n) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(opt.step_count(i));
  return out;
}

// The step function of each hyper-parameter struct (Stem##Step), from the public list.
#define FOPT_RAW_STEP(Stem, Alias)                                                            \
  [[maybe_unused]] void RawStep(std::span<const Stem##Hyper> g, std::span<const Segment> s) { \
    Stem##Step(g, s);                                                                         \
  }
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_RAW_STEP)
#undef FOPT_RAW_STEP

// ---------------------------------------------------------------------------------------------------------
// FlatStorage

// Tensors of two groups, interleaved; group 0 is laid out first, each group in the given order.
const std::vector<TensorSpec> kMixedSpecs = {{3, 1}, {5, 0}, {7, 1}, {2, 0}, {0, 1}, {11, 0}};
// Offsets (in elements) the layout must give them: group 0 = tensors 1, 3, 5; group 1 = tensors 0,
// 2, 4.
const std::vector<std::size_t> kMixedOffsets = {18, 0, 21, 5, 28, 7};

TEST(FlatStorage, LaysTensorsOutGroupByGroup) {
  const StorageOptions options{.param_dtype = DType::kBF16,
                               .grad_dtype = DType::kF16,
                               .state_dtype = DType::kF32,
                               .master_weights = true};
  FlatStorage st(kMixedSpecs, 2, options, 0b101);
  ASSERT_EQ(st.num_tensors(), kMixedSpecs.size());
  EXPECT_EQ(st.total_numel(), 28u);
  const auto* params = static_cast<const std::byte*>(st.flat_params());
  const auto* grads = static_cast<const std::byte*>(st.flat_grads());
  for (std::size_t i = 0; i < kMixedSpecs.size(); ++i) {
    SCOPED_TRACE(i);
    const Segment& s = st.segments()[i];
    const std::size_t o = kMixedOffsets[i];
    EXPECT_EQ(s.numel, kMixedSpecs[i].numel);
    EXPECT_EQ(s.group, kMixedSpecs[i].group);
    EXPECT_EQ(s.param_dtype, DType::kBF16);
    EXPECT_EQ(s.grad_dtype, DType::kF16);
    EXPECT_EQ(s.state_dtype, DType::kF32);
    EXPECT_EQ(s.param, params + o * 2);
    EXPECT_EQ(s.grad, grads + o * 2);
    EXPECT_EQ(st.params<std::uint16_t>(i).data(), s.param);
    EXPECT_EQ(st.params<std::uint16_t>(i).size(), s.numel);
    EXPECT_EQ(st.grads<std::uint16_t>(i).data(), s.grad);
    // States and master follow the same layout in their own arenas.
    const Segment& first = st.segments()[1];  // offset 0
    EXPECT_EQ(Address(s.state[0]), Address(first.state[0]) + o * 4);
    EXPECT_EQ(s.state[1], nullptr);
    EXPECT_EQ(Address(s.state[2]), Address(first.state[2]) + o * 4);
    EXPECT_EQ(st.state<float>(i, 2).data(), s.state[2]);
    EXPECT_EQ(s.master, first.master + o);
    EXPECT_EQ(st.master(i).data(), s.master);
    EXPECT_EQ(st.master(i).size(), s.numel);
  }
}

TEST(FlatStorage, GroupsAreContiguousAndGradsCoverEverything) {
  FlatStorage st(kMixedSpecs, 2, {}, 0);
  const auto* base = static_cast<const float*>(st.flat_grads());
  // Mark each tensor's grads with its index + 1 through the typed views, then read the flat range.
  for (std::size_t i = 0; i < st.num_tensors(); ++i) {
    for (float& g : st.grads<float>(i)) g = static_cast<float>(i + 1);
  }
  std::vector<float> expected;
  for (std::uint32_t g = 0; g < 2; ++g) {
    for (std::size_t i = 0; i < kMixedSpecs.size(); ++i) {
      if (kMixedSpecs[i].group == g)
        expected.insert(expected.end(), kMixedSpecs[i].numel, float(i + 1));
    }
  }
  ASSERT_EQ(expected.size(), st.total_numel());
  EXPECT_EQ(std::vector<float>(base, base + st.total_numel()), expected);
  // Group 0's params form [0, 18), group 1's [18, 28).
  EXPECT_EQ(st.params<float>(1).data(), static_cast<float*>(st.flat_params()));
  EXPECT_EQ(st.params<float>(3).data(), st.params<float>(1).data() + 5);
  EXPECT_EQ(st.params<float>(5).data(), st.params<float>(3).data() + 2);
  EXPECT_EQ(st.params<float>(0).data(), st.params<float>(5).data() + 11);
  EXPECT_EQ(st.params<float>(2).data(), st.params<float>(0).data() + 3);
}

TEST(FlatStorage, ZeroGradZeroesEveryGrad) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    FlatStorage st(kMixedSpecs, 2, {.grad_dtype = t}, 0b1);
    const std::size_t bytes = st.total_numel() * DTypeSize(t);
    std::memset(st.flat_grads(), 0x5A, bytes);
    std::mt19937 rng(1);
    FillRandom(st.flat_params(), DType::kF32, st.total_numel(), rng);
    const Bytes params = Copy(st.flat_params(), st.total_numel() * 4);
    st.ZeroGrad();
    EXPECT_EQ(Copy(st.flat_grads(), bytes), Bytes(bytes, std::byte{0}));
    EXPECT_EQ(Copy(st.flat_params(), st.total_numel() * 4), params);  // only grads
  }
}

TEST(FlatStorage, FreshArenasAreZero) {
  FlatStorage st(kMixedSpecs, 2, {.param_dtype = DType::kBF16, .master_weights = true}, 0b111);
  for (std::size_t i = 0; i < st.num_tensors(); ++i) {
    for (int k = 0; k < kMaxStates; ++k) {
      for (float x : st.state<float>(i, k)) EXPECT_EQ(x, 0.0f);
    }
    for (float x : st.master(i)) EXPECT_EQ(x, 0.0f);
    for (float x : st.grads<float>(i)) EXPECT_EQ(x, 0.0f);
  }
}

TEST(FlatStorage, TypedViewsRejectWrongElementSize) {
  FlatStorage f32(kMixedSpecs, 2, {}, 0b1);
  EXPECT_THROW(f32.params<std::uint16_t>(0), Error);
  EXPECT_THROW(f32.grads<std::uint16_t>(0), Error);
  EXPECT_THROW(f32.state<std::uint16_t>(0, 0), Error);
  EXPECT_THROW(f32.params<double>(0), Error);
  EXPECT_NO_THROW(f32.params<float>(0));
  EXPECT_THROW(f32.master(0), Error);  // master_weights is off

  FlatStorage half(
      kMixedSpecs, 2,
      {.param_dtype = DType::kBF16, .grad_dtype = DType::kF16, .state_dtype = DType::kBF16}, 0b1);
  EXPECT_THROW(half.params<float>(0), Error);
  EXPECT_THROW(half.grads<float>(0), Error);
  EXPECT_THROW(half.state<float>(0, 0), Error);
  EXPECT_NO_THROW(half.params<std::uint16_t>(0));
  EXPECT_NO_THROW(half.grads<std::uint16_t>(0));
  EXPECT_NO_THROW(half.state<std::uint16_t>(0, 0));
  try {
    half.params<float>(0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(FlatStorage, ArenasAre64ByteAligned) {
  const std::vector<TensorSpec> specs = {{3, 0}, {1001, 1}, {17, 0}};
  FlatStorage st(specs, 2, {.param_dtype = DType::kBF16, .master_weights = true}, 0b111);
  EXPECT_EQ(Address(st.flat_params()) % 64, 0u);
  EXPECT_EQ(Address(st.flat_grads()) % 64, 0u);
  const Segment& first = st.segments()[0];  // group 0, offset 0
  for (int k = 0; k < kMaxStates; ++k) EXPECT_EQ(Address(first.state[k]) % 64, 0u) << k;
  EXPECT_EQ(Address(first.master) % 64, 0u);
}

TEST(FlatStorage, RejectsBadOptions) {
  EXPECT_THROW(FlatStorage(kMixedSpecs, 2, {.master_weights = true}, 0), Error);  // f32 params
  EXPECT_THROW(FlatStorage(kMixedSpecs, 1, {}, 0), Error);                        // group 1 of 1
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: Step() is the raw step function on the same inputs (OptimizerOf.StepMatchesRawStep
// runs this for every algorithm).

// Separately allocated buffers for the same tensors, stepped with the raw step function.
template <class Hyper>
class RawModel {
 public:
  RawModel(const std::vector<Hyper>& groups, const std::vector<TensorSpec>& specs,
           const StorageOptions& options)
      : groups_(groups) {
    for (const TensorSpec& t : specs) {
      Segment s;
      s.numel = t.numel;
      s.group = t.group;
      s.param_dtype = options.param_dtype;
      s.grad_dtype = options.grad_dtype;
      s.state_dtype = options.state_dtype;
      s.param = Alloc(t.numel * DTypeSize(options.param_dtype));
      s.grad = Alloc(t.numel * DTypeSize(options.grad_dtype));
      if (options.master_weights) s.master = static_cast<float*>(Alloc(t.numel * sizeof(float)));
      const unsigned slots = RequiredStates(groups[t.group]);
      for (int k = 0; k < kMaxStates; ++k) {
        if ((slots >> k & 1u) != 0) s.state[k] = Alloc(t.numel * DTypeSize(options.state_dtype));
      }
      for (float*& scalar : s.scalars) scalar = static_cast<float*>(Alloc(sizeof(float)));
      segments_.push_back(s);
    }
  }

  std::vector<Segment>& segments() { return segments_; }

  // One step of every tensor, the step-th for all of them.
  void Step(std::int64_t step) {
    for (Segment& s : segments_) {
      s.step = step;
      if (step == 1 && s.master != nullptr) {
        for (std::size_t i = 0; i < s.numel; ++i)
          s.master[i] = LoadAsF32(s.param, s.param_dtype, i);
      }
    }
    RawStep(std::span<const Hyper>(groups_), segments_);
  }

 private:
  void* Alloc(std::size_t bytes) {
    buffers_.emplace_back(bytes + 1);  // + 1: never null, even for numel 0
    return buffers_.back().data();
  }

  std::vector<Hyper> groups_;
  std::vector<Bytes> buffers_;
  std::vector<Segment> segments_;
};

const std::vector<TensorSpec> kWiringSpecs = {{1000, 0}, {40000, 1}, {17, 0},
                                              {0, 1},    {5000, 1},  {33, 0}};

template <class Hyper>
void ExpectStepMatchesRawStep(const std::vector<Hyper>& groups, const StorageOptions& options) {
  Optimizer<Hyper> opt(groups, kWiringSpecs, options);
  RawModel<Hyper> raw(groups, kWiringSpecs, options);
  std::mt19937 rng(42);
  const std::size_t n = kWiringSpecs.size();
  // The raw model starts from the optimizer's fresh states (StartsEachStateWhereTorchStartsIt
  // checks those against torch's).
  for (std::size_t i = 0; i < n; ++i) {
    const Segment& s = opt.storage().segments()[i];
    FillRandom(s.param, s.param_dtype, s.numel, rng);
    std::memcpy(raw.segments()[i].param, s.param, s.numel * DTypeSize(s.param_dtype));
    for (int k = 0; k < kMaxStates; ++k) {
      if (raw.segments()[i].state[k] != nullptr) {
        std::memcpy(raw.segments()[i].state[k], s.state[k], s.numel * DTypeSize(s.state_dtype));
      }
    }
    for (int k = 0; k < kMaxScalars; ++k) *raw.segments()[i].scalars[k] = *s.scalars[k];
  }
  for (std::int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (std::size_t i = 0; i < n; ++i) {
      const Segment& s = opt.storage().segments()[i];
      FillRandom(const_cast<void*>(s.grad), s.grad_dtype, s.numel, rng);
      std::memcpy(const_cast<void*>(raw.segments()[i].grad), s.grad,
                  s.numel * DTypeSize(s.grad_dtype));
    }
    opt.Step();
    raw.Step(step);
    for (std::size_t i = 0; i < n; ++i) {
      SCOPED_TRACE("tensor " + std::to_string(i));
      EXPECT_EQ(opt.step_count(i), step);
      const Segment& s = opt.storage().segments()[i];
      const Segment& r = raw.segments()[i];
      EXPECT_TRUE(SameBytes(s.param, r.param, s.numel * DTypeSize(s.param_dtype))) << "param";
      if (options.master_weights) {
        EXPECT_TRUE(SameBytes(s.master, r.master, s.numel * sizeof(float))) << "master";
      }
      const unsigned slots = RequiredStates(groups[s.group]);
      for (int k = 0; k < kMaxStates; ++k) {
        const std::size_t bytes = s.numel * DTypeSize(s.state_dtype);
        if ((slots >> k & 1u) != 0) {
          EXPECT_TRUE(SameBytes(s.state[k], r.state[k], bytes)) << "state " << k;
        } else if (s.state[k] != nullptr) {  // allocated for another group: never touched
          EXPECT_EQ(Copy(s.state[k], bytes), Bytes(bytes, std::byte{0})) << "unused state " << k;
        }
      }
      for (int k = 0; k < kMaxScalars; ++k)
        EXPECT_EQ(*s.scalars[k], *r.scalars[k]) << "scalar " << k;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: per-tensor step counts.

// A fresh one-tensor Adam fed the given initial params and grads, one Step() per grad.
std::vector<TensorBytes> RunSingle(const AdamHyper& h, const std::vector<float>& params,
                                   const std::vector<std::vector<float>>& grads) {
  Adam opt({h}, {{params.size(), 0}});
  std::copy(params.begin(), params.end(), opt.storage().params<float>(0).begin());
  for (const std::vector<float>& g : grads) {
    std::copy(g.begin(), g.end(), opt.storage().grads<float>(0).begin());
    opt.Step();
  }
  return CaptureAll(opt);
}

std::vector<float> RandomVector(std::size_t n, std::mt19937& rng) {
  std::vector<float> v(n);
  FillRandom(v.data(), DType::kF32, n, rng);
  return v;
}

TEST(Optimizer, PerTensorStepCounts) {
  const AdamHyper h{
      .lr = 0.1, .beta1 = 0.5, .beta2 = 0.6};  // large bias corrections: step counts show
  std::mt19937 rng(7);
  const std::vector<float> p0 = RandomVector(300, rng), p1 = RandomVector(200, rng);
  const std::vector<float> g0a = RandomVector(300, rng), g0b = RandomVector(300, rng);
  const std::vector<float> g1 = RandomVector(200, rng);

  Adam opt({h}, {{300, 0}, {200, 0}});
  std::copy(p0.begin(), p0.end(), opt.storage().params<float>(0).begin());
  std::copy(p1.begin(), p1.end(), opt.storage().params<float>(1).begin());

  std::copy(g0a.begin(), g0a.end(), opt.storage().grads<float>(0).begin());
  const TensorBytes t1_before = Capture(opt.storage().segments()[1]);
  const std::array<std::size_t, 1> only0 = {0};
  opt.StepTensors(only0);
  EXPECT_EQ(opt.step_count(0), 1);
  EXPECT_EQ(opt.step_count(1), 0);
  EXPECT_EQ(Capture(opt.storage().segments()[1]), t1_before) << "a tensor not listed changed";

  std::copy(g0b.begin(), g0b.end(), opt.storage().grads<float>(0).begin());
  std::copy(g1.begin(), g1.end(), opt.storage().grads<float>(1).begin());
  opt.Step();
  EXPECT_EQ(opt.step_count(0), 2);
  EXPECT_EQ(opt.step_count(1), 1);

  const std::vector<TensorBytes> now = CaptureAll(opt);
  // Tensor 1 took its first step (bias correction of step 1), tensor 0 its second.
  EXPECT_EQ(now[1], RunSingle(h, p1, {g1})[0]);
  EXPECT_EQ(now[0], RunSingle(h, p0, {g0a, g0b})[0]);
  // Sanity: with the shared count (2) tensor 1 would have come out differently.
  EXPECT_NE(now[1].param, RunSingle(h, p1, {std::vector<float>(200, 0.0f), g1})[0].param);
}

// `opt.Step({0})` used to bind to Step(StepOptions{.scaler = 0}) and update every tensor. A braced
// index list must not compile as Step's argument; StepTensors({0}) takes it.
template <class O>
concept StepTakesBracedIndex = requires(O& o) {
  o.Step({std::size_t{0}});
};
#define FOPT_CHECK_BRACED_STEP(Stem, Alias) \
  static_assert(!StepTakesBracedIndex<Alias>, #Alias ": Step({0}) must not compile");
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_CHECK_BRACED_STEP)
#undef FOPT_CHECK_BRACED_STEP

// ---------------------------------------------------------------------------------------------------------
// Optimizer: live hyper-parameters.

TEST(Optimizer, LrChangesTakeEffect) {
  SGD opt({{.lr = 0.1}}, {{257, 0}});
  std::mt19937 rng(11);
  std::span<float> p = opt.storage().params<float>(0);
  std::span<float> g = opt.storage().grads<float>(0);
  FillRandom(p.data(), DType::kF32, p.size(), rng);
  std::vector<float> expected(p.begin(), p.end());
  for (double lr : {0.1, 0.5, 0.0, 0.25}) {
    opt.group(0).lr = lr;
    FillRandom(g.data(), DType::kF32, g.size(), rng);
    for (std::size_t i = 0; i < p.size(); ++i) {
      expected[i] =
          std::fma(static_cast<float>(-lr), g[i], expected[i]);  // plain SGD: p += -lr * g
    }
    opt.Step();
    EXPECT_TRUE(SameBytes(p.data(), expected.data(), p.size_bytes())) << "lr " << lr;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: state allocation.

// Switching on a setting that needs more state (as a schedule or a user may) allocates it at the
// next step, zero-filled like torch's lazily created state.
TEST(Optimizer, StateSwitchedOnLaterIsAllocated) {
  Adam adam({{.lr = 0.1}}, {{5, 0}});
  std::ranges::fill(adam.storage().grads<float>(0), 1.0f);
  adam.Step();
  adam.group(0).amsgrad = true;
  adam.Step();
  for (float v : adam.storage().state<float>(0, kMaxExpAvgSq)) {
    EXPECT_EQ(v, adam.storage().state<float>(0, kExpAvgSq)[0]);  // max(0, v) = v
  }
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: threads (OptimizerOf.OneAndTwoThreadsGiveIdenticalBits runs this for every algorithm).

template <class Hyper>
void ExpectThreadCountInvariant(const Hyper& h) {
  const std::vector<TensorSpec> specs = {{70001, 0}, {3, 1}, {50000, 0}, {80123, 1}, {1, 0}};
  Runtime one(1), two(2);
  Optimizer<Hyper> a({h, h}, specs, {}, one);
  Optimizer<Hyper> b({h, h}, specs, {}, two);
  std::mt19937 rng(19);
  FillRandom(a.storage().flat_params(), DType::kF32, a.storage().total_numel(), rng);
  std::memcpy(b.storage().flat_params(), a.storage().flat_params(), a.storage().total_numel() * 4);
  for (int step = 0; step < 5; ++step) {
    FillRandom(a.storage().flat_grads(), DType::kF32, a.storage().total_numel(), rng);
    std::memcpy(b.storage().flat_grads(), a.storage().flat_grads(), a.storage().total_numel() * 4);
    a.Step();
    b.Step();
  }
  EXPECT_EQ(CaptureAll(a), CaptureAll(b));
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: every algorithm of the registry (src/algos/registry.h), each with the cases of its
// file tests/reference/<algo>.h (namespace ref::validation). A case an algorithm's file lacks is a
// compile error here (no overload for its Hyper), so that a new algorithm is never skipped
// silently; validation_test.cc checks that the optional cases (scalar states, channel rows,
// factored shapes) exist exactly where the descriptor declares those.

// Test names show the algorithm (OptimizerOf/<kName>.KeepsScalarStatesPerTensor).
struct AlgorithmNames {
  template <class Hyper>
  static std::string GetName(int /*index*/) {
    return algos::DescriptorOf<Hyper>::kName;
  }
};
template <class Hyper>
class OptimizerOf : public ::testing::Test {};
TYPED_TEST_SUITE(OptimizerOf, test::HyperTypes<algos::All>, AlgorithmNames);

template <class Hyper>
constexpr std::type_identity<Hyper> kTag{};

template <class Hyper>
concept HasScalarCases = requires {
  ref::validation::ScalarStateKeys(kTag<Hyper>);
};
template <class Hyper>
concept HasChannelRowCases = requires {
  ref::validation::ChannelRowsOf64(kTag<Hyper>);
};
template <class Hyper>
concept HasFactoredCases = requires {
  ref::validation::FactoredSlots(kTag<Hyper>);
};
template <class Hyper>
concept HasFirstStepCase = requires(const Hyper& h) {
  ref::validation::AfterFirstStep(h, 1.0f, -0.5f);
};

// Every state slot a group needs starts at what torch starts it from (the case file's values:
// zeros mostly, an accumulator at its initial value, step sizes at the group's lr), per group, in
// f32 and bf16 state.
TYPED_TEST(OptimizerOf, StartsEachStateWhereTorchStartsIt) {
  using Hyper = TypeParam;
  const auto cases = ref::validation::InitialStates(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  std::vector<Hyper> groups;
  std::vector<TensorSpec> specs;
  for (std::uint32_t g = 0; g < cases.size(); ++g) {
    groups.push_back(cases[g].first);
    specs.push_back({100, g});
    specs.push_back({33, g});
  }
  specs.push_back({40000, 0});  // several chunks
  for (const DType state_dtype : {DType::kF32, DType::kBF16, DType::kQ8}) {
    SCOPED_TRACE(DTypeName(state_dtype));
    if (state_dtype == DType::kQ8 && !algos::QuantizableStates<algos::DescriptorOf<Hyper>>) {
      continue;
    }
    Optimizer<Hyper> opt(groups, specs, {.state_dtype = state_dtype, .min_8bit_size = 0});
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::vector<float>& want = cases[specs[i].group].second;
      const unsigned slots = RequiredStates(groups[specs[i].group]);
      for (int k = 0; k < kMaxStates; ++k) {
        if ((slots >> k & 1u) == 0) continue;
        ASSERT_LT(static_cast<std::size_t>(k), want.size());
        if (state_dtype == DType::kF32) {
          for (const float x : opt.storage().template state<float>(i, k))
            ASSERT_EQ(x, want[k]) << "tensor " << i << ", slot " << k;
        } else if (state_dtype == DType::kQ8) {  // a constant block reads back exactly
          const QuantMap map = (algos::UnsignedMapStates<algos::DescriptorOf<Hyper>>() >> k & 1u)
                                   ? QuantMap::kUnsigned
                                   : QuantMap::kSigned;
          const std::span<std::uint8_t> codes = opt.storage().template state<std::uint8_t>(i, k);
          std::vector<float> values(codes.size());
          Dequantize(codes.data(), opt.storage().absmax(i, k).data(), codes.size(), map,
                     values.data());
          for (const float x : values) ASSERT_EQ(x, want[k]) << "tensor " << i << ", slot " << k;
        } else {
          for (const std::uint16_t x : opt.storage().template state<std::uint16_t>(i, k))
            ASSERT_EQ(x, F32ToBF16(want[k])) << "tensor " << i << ", slot " << k;
        }
      }
    }
  }
  // Where the case file gives a first step's outcome from there (AfterFirstStep; the kernel tests
  // check every algorithm's steps against its oracle): every param 1, every grad -0.5.
  if constexpr (HasFirstStepCase<Hyper>) {
    Optimizer<Hyper> opt(groups, specs);
    std::ranges::fill(
        std::span(static_cast<float*>(opt.storage().flat_params()), opt.storage().total_numel()),
        1.0f);
    std::ranges::fill(
        std::span(static_cast<float*>(opt.storage().flat_grads()), opt.storage().total_numel()),
        -0.5f);
    opt.Step();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const Hyper& h = groups[specs[i].group];
      const std::vector<float> want = ref::validation::AfterFirstStep(h, 1.0f, -0.5f);
      for (const float p : opt.storage().template params<float>(i))
        ASSERT_EQ(p, want.at(0)) << "tensor " << i;
      const unsigned slots = RequiredStates(h);
      for (int k = 0; k < kMaxStates; ++k) {
        if ((slots >> k & 1u) == 0) continue;
        for (const float x : opt.storage().template state<float>(i, k))
          ASSERT_EQ(x, want.at(1 + k)) << "tensor " << i << ", slot " << k;
      }
    }
  }
}

// With 8-bit states (state_dtype kQ8) every tensor of at least min_8bit_size elements keeps codes
// and an absmax per block, the smaller ones f32 states. A step from states that quantize exactly
// (the initial ones: each block one value) is the f32 step: its params are the f32 optimizer's,
// bit for bit, and its codes and absmax are Quantize (tested against bitsandbytes' maps in
// quantized_state_test.cc) of the f32 optimizer's new states. The small tensor stays the f32
// optimizer's through every step. An algorithm whose sums are per row of a tensor or that
// factors its states refuses 8-bit states at construction.
TYPED_TEST(OptimizerOf, EightBitStatesStepAsF32AndQuantizeTheResult) {
  using Hyper = TypeParam;
  using Descriptor = algos::DescriptorOf<Hyper>;
  Hyper h;
  if constexpr (requires { h.momentum; }) h.momentum = 0.9;
  if constexpr (requires { h.weight_decay; }) h.weight_decay = 0.01;
  // Quantized: 300 elements (a partial second block), 4096 (the default min_8bit_size) and an
  // empty tensor; f32: 255 elements.
  const std::vector<TensorSpec> specs = {{300, 0}, {255, 0}, {0, 0}, {4096, 0}};
  const StorageOptions q8{.state_dtype = DType::kQ8, .min_8bit_size = 256};
  if constexpr (!algos::QuantizableStates<Descriptor>) {
    try {
      Optimizer<Hyper> refused({h}, specs, q8);
      ADD_FAILURE() << "8-bit states were taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("8-bit states"), std::string::npos) << e.what();
    }
  } else {
    Optimizer<Hyper> f32({h}, specs), eight({h}, specs, q8);
    ASSERT_EQ(eight.storage().segments()[1].state_dtype, DType::kF32);
    constexpr unsigned kUnsigned = algos::UnsignedMapStates<Descriptor>();
    for (int step = 0; step < 3; ++step) {
      for (Optimizer<Hyper>* opt : {&f32, &eight}) {
        for (const Segment& s : opt->storage().segments()) {
          for (std::size_t i = 0; i < s.numel; ++i) {
            if (step == 0) StoreFromF32(s.param, s.param_dtype, i, Value(1, s.global_offset + i));
            StoreFromF32(const_cast<void*>(s.grad), s.grad_dtype, i,
                         Value(10 + static_cast<unsigned>(step), s.global_offset + i));
          }
        }
        opt->Step();
      }
      SCOPED_TRACE("step " + std::to_string(step + 1));
      EXPECT_EQ(Capture(f32.storage().segments()[1]), Capture(eight.storage().segments()[1]));
      if (step > 0) continue;
      for (std::size_t t : {std::size_t{0}, std::size_t{3}}) {
        const Segment& a = f32.storage().segments()[t];
        const Segment& b = eight.storage().segments()[t];
        ASSERT_EQ(b.state_dtype, DType::kQ8);
        EXPECT_TRUE(SameBytes(a.param, b.param, a.numel * sizeof(float))) << "tensor " << t;
        for (int k = 0; k < kMaxStates; ++k) {
          ASSERT_EQ(a.state[k] == nullptr, b.state[k] == nullptr);
          if (a.state[k] == nullptr) continue;
          const QuantMap map = (kUnsigned >> k & 1u) ? QuantMap::kUnsigned : QuantMap::kSigned;
          std::vector<std::uint8_t> codes(a.numel);
          std::vector<float> absmax(NumQuantBlocks(a.numel));
          Quantize(static_cast<const float*>(a.state[k]), a.numel, map, codes.data(),
                   absmax.data());
          EXPECT_TRUE(SameBytes(codes.data(), b.state[k], a.numel))
              << "tensor " << t << ", slot " << k;
          const std::span<float> kept = eight.storage().absmax(t, k);
          EXPECT_TRUE(std::ranges::equal(absmax, kept)) << "tensor " << t << ", slot " << k;
        }
      }
    }
    // Per param: one byte per state and 4 per 256 elements for the quantized tensors, 4 per state
    // for the f32 one.
    const double states = std::popcount(RequiredStates(h));
    const double want = states * ((300 + 4096) * 1.0 + (2 + 16) * 4.0 + 255 * 4.0) / 4651;
    EXPECT_DOUBLE_EQ(eight.storage().state_bytes_per_param(), want);
    EXPECT_THROW(eight.storage().absmax(1, std::countr_zero(RequiredStates(h))), Error);
  }
}

// Optimizer<> keeps each tensor's per-tensor scalar states (FlatStorage::scalars), starting where
// torch starts them (the case file's InitialScalars) and advanced by every step, an empty tensor's
// too, as torch's f32 state (ScalarsAfter). An algorithm without scalar states leaves them 0.
TYPED_TEST(OptimizerOf, KeepsScalarStatesPerTensor) {
  using Hyper = TypeParam;
  const std::vector<TensorSpec> specs = {{100, 0}, {0, 0}, {7, 0}};
  const auto fill_grads = [](Optimizer<Hyper>& opt) {
    std::ranges::fill(
        std::span(static_cast<float*>(opt.storage().flat_grads()), opt.storage().total_numel()),
        0.5f);
  };
  if constexpr (HasScalarCases<Hyper>) {
    const std::size_t n = ref::validation::ScalarStateKeys(kTag<Hyper>).size();
    const std::vector<Hyper> cases = ref::validation::ScalarStateHypers(kTag<Hyper>);
    ASSERT_FALSE(cases.empty());
    for (const Hyper& h : cases) {
      Optimizer<Hyper> opt({h}, specs);
      const auto scalars_of = [&](std::size_t i) {
        const std::span<const float> all = opt.storage().scalars(i);
        return std::vector<float>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
      };
      std::vector<float> expected = ref::validation::InitialScalars(h);
      ASSERT_EQ(expected.size(), n);
      for (std::size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(scalars_of(i), expected) << i;
      for (std::int64_t step = 1; step <= 4; ++step) {
        fill_grads(opt);
        opt.Step();
        expected = ref::validation::ScalarsAfter(h, step, expected);
        for (std::size_t i = 0; i < specs.size(); ++i) {
          EXPECT_EQ(scalars_of(i), expected) << "tensor " << i << ", step " << step;
        }
      }
    }
  } else {
    Optimizer<Hyper> opt({Hyper{}}, specs);
    for (int step = 1; step <= 2; ++step) {
      fill_grads(opt);
      opt.Step();
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      for (const float x : opt.storage().scalars(i)) EXPECT_EQ(x, 0.0f) << "tensor " << i;
    }
  }
}

// Optimizer<> hands TensorSpec::rows and cols to the step: a tensor with channel rows ((8, 8):
// rows 8) or a factored one (a batch of two (4, 8) matrices: rows 4, cols 8, whose row and column
// factors hold 8 and 16 values) is stepped exactly as the raw step steps a segment of that shape,
// and differently from a flat one. Every other algorithm ignores the shape.
TYPED_TEST(OptimizerOf, TakesTheShapeOfTensorSpec) {
  using Hyper = TypeParam;
  std::vector<float> p(64), g(64);
  for (std::size_t i = 0; i < 64; ++i) {
    p[i] = std::sin(static_cast<float>(i) + 0.5f);
    g[i] = std::cos(3.0f * static_cast<float>(i));
  }
  const auto step_once = [&](Optimizer<Hyper>& opt) {
    std::ranges::copy(p, opt.storage().template params<float>(0).begin());
    std::ranges::copy(g, opt.storage().template grads<float>(0).begin());
    opt.Step();
  };
  if constexpr (HasChannelRowCases<Hyper> || HasFactoredCases<Hyper>) {
    const Hyper h = ref::validation::ShapedHyper(kTag<Hyper>);
    const TensorSpec shaped = HasFactoredCases<Hyper>
                                  ? TensorSpec{.numel = 64, .rows = 4, .cols = 8}
                                  : TensorSpec{.numel = 64, .rows = 8};
    Optimizer<Hyper> with_shape({h}, {shaped});
    Optimizer<Hyper> flat({h}, {{.numel = 64}});
    step_once(with_shape);
    step_once(flat);
    Segment raw{
        .param = p.data(), .grad = g.data(), .numel = 64, .rows = shaped.rows, .cols = shaped.cols};
    std::array<std::vector<float>, kMaxStates> states;
    const unsigned slots = RequiredStates(h);
    for (int k = 0; k < kMaxStates; ++k) {
      if ((slots >> k & 1u) != 0) states[k].assign(64, 0.0f);
    }
    if constexpr (HasFactoredCases<Hyper>) {
      const std::vector<int> factored = ref::validation::FactoredSlots(kTag<Hyper>);
      states[factored.at(0)].assign(64 / shaped.cols, 0.0f);  // one per row of each matrix
      states[factored.at(1)].assign(64 / shaped.rows, 0.0f);  // one per column of each matrix
      states[factored.at(2)].clear();                         // a matrix has no variance
    }
    for (int k = 0; k < kMaxStates; ++k) {
      if (!states[k].empty()) raw.state[k] = states[k].data();
    }
    RawStep(std::span<const Hyper>(&h, 1), std::span<const Segment>(&raw, 1));
    EXPECT_TRUE(std::ranges::equal(with_shape.storage().template params<float>(0), p));
    for (int k = 0; k < kMaxStates; ++k) {
      if (states[k].empty()) continue;
      EXPECT_TRUE(std::ranges::equal(
          with_shape.storage().template state<float>(0, k).first(states[k].size()), states[k]))
          << "slot " << k;
    }
    EXPECT_FALSE(std::ranges::equal(flat.storage().template params<float>(0), p));
  } else {
    const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
    Optimizer<Hyper> with_rows({h}, {{.numel = 64, .rows = 8}});
    Optimizer<Hyper> flat({h}, {{.numel = 64}});
    step_once(with_rows);
    step_once(flat);
    EXPECT_EQ(CaptureAll(with_rows), CaptureAll(flat));
    EXPECT_FALSE(std::ranges::equal(flat.storage().template params<float>(0), p));
  }
}

// Step() is the raw step function on the same inputs (per-tensor step counts, state slots and
// scalar states, groups, master weights), for each of the case file's groups and storage options.
TYPED_TEST(OptimizerOf, StepMatchesRawStep) {
  using Hyper = TypeParam;
  const auto cases = ref::validation::OptimizerCases<StorageOptions>(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  for (const auto& [groups, options] : cases) ExpectStepMatchesRawStep<Hyper>(groups, options);
}

// One and two threads give identical bits, with each group of the cases above.
TYPED_TEST(OptimizerOf, OneAndTwoThreadsGiveIdenticalBits) {
  for (const auto& [groups, options] :
       ref::validation::OptimizerCases<StorageOptions>(kTag<TypeParam>)) {
    for (const TypeParam& h : groups) ExpectThreadCountInvariant(h);
  }
}

// A tensor gets exactly the state slots its group needs (the case file's RequiredStates cases),
// and the typed views reject the others.
TYPED_TEST(OptimizerOf, StateSlotsFollowRequiredStates) {
  using Hyper = TypeParam;
  const auto cases = ref::validation::RequiredStatesCases(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  for (const auto& [h, slots] : cases) {
    SCOPED_TRACE(slots);
    Optimizer<Hyper> opt({h}, {{100, 0}, {10, 0}});
    for (std::size_t i = 0; i < 2; ++i) {
      const Segment& s = opt.storage().segments()[i];
      for (int k = 0; k < kMaxStates; ++k) {
        if ((slots >> k & 1u) != 0) {
          EXPECT_NE(s.state[k], nullptr) << "slot " << k;
          EXPECT_EQ(opt.storage().template state<float>(i, k).size(), s.numel) << "slot " << k;
        } else {
          EXPECT_EQ(s.state[k], nullptr) << "slot " << k;
          EXPECT_THROW(opt.storage().template state<float>(i, k), Error) << "slot " << k;
        }
      }
      EXPECT_THROW(opt.storage().template state<float>(i, -1), Error);
      EXPECT_THROW(opt.storage().template state<float>(i, kMaxStates), Error);
    }
  }
}

// Random params and grads for every tensor of `opt`.
template <class Hyper>
void FillParamsAndGrads(Optimizer<Hyper>& opt, std::uint32_t seed) {
  std::mt19937 rng(seed);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
}

TYPED_TEST(OptimizerOf, StepOfASubsetLeavesTheOthersAlone) {
  using Hyper = TypeParam;
  Optimizer<Hyper> opt({ref::validation::AllStatesHyper(kTag<Hyper>)},
                       {{100, 0}, {50, 0}, {70, 0}});
  FillParamsAndGrads(opt, 3);
  const std::vector<TensorBytes> before = CaptureAll(opt);
  const std::array<std::size_t, 2> some = {2, 0};
  opt.StepTensors(some);
  const std::vector<TensorBytes> after = CaptureAll(opt);
  EXPECT_EQ(after[1], before[1]);
  EXPECT_NE(after[0].param, before[0].param);
  EXPECT_NE(after[2].param, before[2].param);
  EXPECT_EQ(StepCounts(opt, 3), (std::vector<std::int64_t>{1, 0, 1}));
}

TYPED_TEST(OptimizerOf, StepTensorsOfABracedListUpdatesOnlyThose) {
  using Hyper = TypeParam;
  Optimizer<Hyper> opt({Hyper{}}, {{100, 0}, {50, 0}});
  FillParamsAndGrads(opt, 4);
  const std::vector<TensorBytes> before = CaptureAll(opt);
  opt.StepTensors({0});
  const std::vector<TensorBytes> after = CaptureAll(opt);
  EXPECT_NE(after[0].param, before[0].param);
  EXPECT_EQ(after[1], before[1]) << "StepTensors({0}) changed tensor 1";
}

TYPED_TEST(OptimizerOf, BadTensorIndicesThrowAndChangeNothing) {
  using Hyper = TypeParam;
  Optimizer<Hyper> opt({ref::validation::AllStatesHyper(kTag<Hyper>)},
                       {{100, 0}, {50, 0}, {70, 0}});
  FillParamsAndGrads(opt, 5);
  opt.Step();
  std::mt19937 rng(6);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
  const std::vector<TensorBytes> before = CaptureAll(opt);

  const std::array<std::size_t, 3> duplicate = {1, 0, 1};
  EXPECT_THROW(opt.StepTensors(duplicate), Error);
  const std::array<std::size_t, 2> out_of_range = {0, 3};
  EXPECT_THROW(opt.StepTensors(out_of_range), Error);
  const std::array<std::size_t, 2> huge = {2, static_cast<std::size_t>(-1)};
  EXPECT_THROW(opt.StepTensors(huge), Error);
  EXPECT_EQ(CaptureAll(opt), before);
  EXPECT_EQ(StepCounts(opt, 3), (std::vector<std::int64_t>{1, 1, 1}));

  try {
    opt.StepTensors(duplicate);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 1"), std::string::npos) << e.what();
  }
  try {
    opt.StepTensors(out_of_range);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 3"), std::string::npos) << e.what();
  }
}

TYPED_TEST(OptimizerOf, InvalidLrThrowsAndChangesNothing) {
  using Hyper = TypeParam;
  const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
  Optimizer<Hyper> opt({h, h}, {{300, 0}, {40000, 1}});
  FillParamsAndGrads(opt, 13);
  opt.Step();
  std::mt19937 rng(14);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
  const std::vector<TensorBytes> before = CaptureAll(opt);

  opt.group(1).lr = -0.5;
  try {
    opt.Step();
    ADD_FAILURE() << "Step with lr -0.5 did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("lr"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-0.5"), std::string::npos) << msg;
  }
  const std::array<std::size_t, 1> only0 = {0};  // tensor 0's group is valid, the check is global
  EXPECT_THROW(opt.StepTensors(only0), Error);
  EXPECT_EQ(CaptureAll(opt), before);
  EXPECT_EQ(StepCounts(opt, 2), (std::vector<std::int64_t>{1, 1}));

  // Fixing the lr resumes from the same state: the next step is the second.
  opt.group(1).lr = h.lr;
  opt.Step();
  EXPECT_EQ(StepCounts(opt, 2), (std::vector<std::int64_t>{2, 2}));
}

// Each of the case file's invalid groups, and a tensor in a group that does not exist.
TYPED_TEST(OptimizerOf, InvalidHyperInConstructorThrows) {
  using Hyper = TypeParam;
  const auto cases = ref::validation::RejectedHypers(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  for (const auto& [bad, needles] : cases) {
    EXPECT_THROW(Optimizer<Hyper>({bad}, {{10, 0}}), Error) << needles.front();
  }
  EXPECT_THROW(Optimizer<Hyper>({Hyper{}}, {{10, 1}}), Error);  // group out of range
}

TYPED_TEST(OptimizerOf, MasterWeightsWithBf16Params) {
  using Hyper = TypeParam;
  const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
  const std::vector<TensorSpec> specs = {{1000, 0}, {40000, 0}};
  Optimizer<Hyper> opt({h}, specs, {.param_dtype = DType::kBF16, .master_weights = true});
  // The same tensors as f32 params, no master: the master path must compute exactly this.
  Optimizer<Hyper> ref({h}, specs);
  std::mt19937 rng(17);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::span<std::uint16_t> p = opt.storage().template params<std::uint16_t>(i);
    FillRandom(p.data(), DType::kBF16, p.size(), rng);
    std::span<float> r = ref.storage().template params<float>(i);
    for (std::size_t k = 0; k < p.size(); ++k) r[k] = BF16ToF32(p[k]);
  }
  for (int step = 1; step <= 4; ++step) {
    SCOPED_TRACE(step);
    FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
    std::memcpy(ref.storage().flat_grads(), opt.storage().flat_grads(),
                opt.storage().total_numel() * 4);
    opt.Step();
    ref.Step();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      std::span<const float> master = opt.storage().master(i);
      std::span<const float> want = ref.storage().template params<float>(i);
      ASSERT_TRUE(SameBytes(master.data(), want.data(), master.size_bytes()))
          << "master of tensor " << i;
      std::span<const std::uint16_t> p = opt.storage().template params<std::uint16_t>(i);
      for (std::size_t k = 0; k < p.size(); ++k) {
        ASSERT_EQ(p[k], F32ToBF16(master[k])) << "tensor " << i << " element " << k;
      }
    }
  }
}

// A rejected first step must not seed the master copy either.
TYPED_TEST(OptimizerOf, RejectedFirstStepLeavesMasterUntouched) {
  using Hyper = TypeParam;
  Optimizer<Hyper> opt({Hyper{}}, {{4, 0}}, {.param_dtype = DType::kBF16, .master_weights = true});
  std::ranges::fill(opt.storage().template params<std::uint16_t>(0), F32ToBF16(1.5f));
  opt.group(0).lr = -1.0;
  EXPECT_THROW(opt.Step(), Error);
  for (float m : opt.storage().master(0)) EXPECT_EQ(m, 0.0f);
  EXPECT_EQ(opt.step_count(0), 0);
  opt.group(0).lr = Hyper{}.lr;
  opt.Step();
  EXPECT_NEAR(opt.storage().master(0)[0], 1.5f, 0.02f);
}

TYPED_TEST(OptimizerOf, MasterWeightsWithF32ParamsThrows) {
  using Hyper = TypeParam;
  EXPECT_THROW(Optimizer<Hyper>({Hyper{}}, {{10, 0}}, {.master_weights = true}), Error);
  EXPECT_THROW(
      Optimizer<Hyper>({Hyper{}}, {{10, 0}}, {.param_dtype = DType::kF32, .master_weights = true}),
      Error);
}

TYPED_TEST(OptimizerOf, ZeroGradZeroesGradsOnly) {
  using Hyper = TypeParam;
  Optimizer<Hyper> opt({Hyper{}}, {{100, 0}, {20, 0}});
  std::mt19937 rng(23);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng, 0.5f, 1.0f);
  const Bytes params = Copy(opt.storage().flat_params(), opt.storage().total_numel() * 4);
  opt.ZeroGrad();
  for (std::size_t i = 0; i < 2; ++i) {
    for (float g : opt.storage().template grads<float>(i)) ASSERT_EQ(g, 0.0f);
  }
  EXPECT_EQ(Copy(opt.storage().flat_params(), opt.storage().total_numel() * 4), params);
}

template <class Hyper>
concept HasMomentumSwitchCases = requires {
  ref::validation::MomentumSwitchedOnLater(kTag<Hyper>);
};

// torch starts a momentum buffer as a copy of the gradient on its first momentum step (no
// dampening), also when momentum is switched on after earlier plain steps: for every algorithm
// whose Segment::step counts the buffer's steps (algos::HasBufferSteps), whose case file must then
// give the param and the buffer after each step.
TEST(Optimizer, MomentumSwitchedOnLaterStartsFromTheGradient) {
  int checked = 0;
  algos::All::ForEach([&]<class A>(std::type_identity<A> /*tag*/) {
    using Hyper = typename A::Hyper;
    static_assert(HasMomentumSwitchCases<Hyper> == algos::HasBufferSteps<A>,
                  "buffer steps of the descriptor and of the case file (MomentumSwitchedOnLater) "
                  "differ");
    if constexpr (HasMomentumSwitchCases<Hyper>) {
      SCOPED_TRACE(A::kName);
      ++checked;
      const auto [hypers, slot] = ref::validation::MomentumSwitchedOnLater(kTag<Hyper>);
      const auto steps = ref::validation::MomentumSwitchedOnLaterSteps(kTag<Hyper>);
      Optimizer<Hyper> opt({hypers.first}, {{3, 0}});
      std::ranges::fill(opt.storage().template grads<float>(0), 2.0f);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        if (i == 1) opt.group(0) = hypers.second;
        opt.Step();
        EXPECT_FLOAT_EQ(opt.storage().template params<float>(0)[0], steps[i].first)
            << "step " << i + 1;
        if (i >= 1) {
          EXPECT_FLOAT_EQ(opt.storage().template state<float>(0, slot)[0], steps[i].second)
              << "step " << i + 1;
        }
      }
    }
  });
  EXPECT_GE(checked, 1);
}

}  // namespace
}  // namespace fusedopt
