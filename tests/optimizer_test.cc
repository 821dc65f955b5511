// The C++ Optimizer layer (optimizer.h): FlatStorage's layout, and Optimizer<Hyper>'s wiring of the
// raw step functions (per-tensor step counts, state slots, groups, live hyper-parameters, master
// weights, threads).

#include "fusedopt/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
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
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

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

void RawStep(std::span<const SgdHyper> g, std::span<const Segment> s) { SgdStep(g, s); }
void RawStep(std::span<const AdamHyper> g, std::span<const Segment> s) { AdamStep(g, s); }
void RawStep(std::span<const AdamWHyper> g, std::span<const Segment> s) { AdamWStep(g, s); }
void RawStep(std::span<const RmspropHyper> g, std::span<const Segment> s) { RmspropStep(g, s); }
void RawStep(std::span<const AdagradHyper> g, std::span<const Segment> s) { AdagradStep(g, s); }
void RawStep(std::span<const LarsHyper> g, std::span<const Segment> s) { LarsStep(g, s); }

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
// Optimizer: Step() is the raw step function on the same inputs.

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
        if ((slots >> k & 1u) == 0) continue;
        s.state[k] = Alloc(t.numel * DTypeSize(options.state_dtype));
        if constexpr (std::is_same_v<Hyper, AdagradHyper>) {
          const auto init = static_cast<float>(groups[t.group].initial_accumulator_value);
          for (std::size_t i = 0; i < t.numel; ++i)
            StoreFromF32(s.state[k], s.state_dtype, i, init);
        }
      }
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
  for (std::size_t i = 0; i < n; ++i) {
    const Segment& s = opt.storage().segments()[i];
    FillRandom(s.param, s.param_dtype, s.numel, rng);
    std::memcpy(raw.segments()[i].param, s.param, s.numel * DTypeSize(s.param_dtype));
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
    }
  }
}

TEST(Optimizer, SgdStepMatchesRawStep) {
  ExpectStepMatchesRawStep<SgdHyper>(
      {{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
       {.lr = 0.05, .maximize = true}},
      {});
  ExpectStepMatchesRawStep<SgdHyper>(
      {{.lr = 0.1, .momentum = 0.5, .nesterov = true},
       {.lr = 0.02, .momentum = 0.9, .weight_decay = 0.1}},
      {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .state_dtype = DType::kBF16});
}

TEST(Optimizer, LarsStepMatchesRawStep) {
  ExpectStepMatchesRawStep<LarsHyper>(
      {{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
       {.lr = 0.05, .weight_decay = 1e-3, .clip = false}},
      {});
  ExpectStepMatchesRawStep<LarsHyper>(
      {{.lr = 1e-3, .momentum = 0.5, .nesterov = true}, {.lr = 0.02, .trust_coefficient = 0.1}},
      {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .state_dtype = DType::kBF16});
}

TEST(Optimizer, AdamStepMatchesRawStep) {
  ExpectStepMatchesRawStep<AdamHyper>(
      {{.lr = 1e-2, .amsgrad = true},
       {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.1}},
      {});
  ExpectStepMatchesRawStep<AdamHyper>(
      {{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = true},
       {.lr = 1e-3, .maximize = true}},
      {.param_dtype = DType::kF16, .grad_dtype = DType::kF32, .state_dtype = DType::kF16});
}

TEST(Optimizer, AdamWStepMatchesRawStep) {
  ExpectStepMatchesRawStep<AdamWHyper>(
      {{.lr = 1e-2, .weight_decay = 0.05}, {.lr = 2e-3, .amsgrad = true}}, {});
  ExpectStepMatchesRawStep<AdamWHyper>(
      {{.lr = 1e-2, .weight_decay = 0.05}, {.lr = 2e-3, .amsgrad = true, .maximize = true}},
      {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true});
}

TEST(Optimizer, RmspropStepMatchesRawStep) {
  ExpectStepMatchesRawStep<RmspropHyper>(
      {{.lr = 1e-2, .alpha = 0.9, .momentum = 0.5, .centered = true},
       {.lr = 5e-3, .weight_decay = 0.01}},
      {});
  ExpectStepMatchesRawStep<RmspropHyper>(
      {{.lr = 1e-2, .centered = true}, {.lr = 5e-3, .momentum = 0.9, .maximize = true}},
      {.param_dtype = DType::kF16, .grad_dtype = DType::kF16, .state_dtype = DType::kF32});
}

TEST(Optimizer, AdagradStepMatchesRawStep) {
  ExpectStepMatchesRawStep<AdagradHyper>(
      {{.lr = 0.1, .lr_decay = 0.01, .initial_accumulator_value = 0.1},
       {.lr = 0.05, .weight_decay = 0.01, .eps = 1e-6}},
      {});
  ExpectStepMatchesRawStep<AdagradHyper>({{.lr = 0.1, .initial_accumulator_value = 0.5},
                                          {.lr = 0.05, .lr_decay = 0.1, .maximize = true}},
                                         {.param_dtype = DType::kBF16,
                                          .grad_dtype = DType::kF32,
                                          .state_dtype = DType::kBF16,
                                          .master_weights = true});
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

TEST(Optimizer, StepOfASubsetLeavesTheOthersAlone) {
  SGD opt({{.lr = 0.1, .momentum = 0.9}}, {{100, 0}, {50, 0}, {70, 0}});
  std::mt19937 rng(3);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
  const std::vector<TensorBytes> before = CaptureAll(opt);
  const std::array<std::size_t, 2> some = {2, 0};
  opt.StepTensors(some);
  const std::vector<TensorBytes> after = CaptureAll(opt);
  EXPECT_EQ(after[1], before[1]);
  EXPECT_NE(after[0].param, before[0].param);
  EXPECT_NE(after[2].param, before[2].param);
  EXPECT_EQ(StepCounts(opt, 3), (std::vector<std::int64_t>{1, 0, 1}));
}

// `opt.Step({0})` used to bind to Step(StepOptions{.scaler = 0}) and update every tensor. A braced
// index list must not compile as Step's argument; StepTensors({0}) takes it.
template <class O>
concept StepTakesBracedIndex = requires(O& o) {
  o.Step({std::size_t{0}});
};
static_assert(!StepTakesBracedIndex<SGD>, "Step({0}) must not compile");
static_assert(!StepTakesBracedIndex<AdamW>, "Step({0}) must not compile");

TEST(Optimizer, StepTensorsOfABracedListUpdatesOnlyThose) {
  SGD opt({{.lr = 0.1}}, {{100, 0}, {50, 0}});
  std::mt19937 rng(4);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
  const std::vector<TensorBytes> before = CaptureAll(opt);
  opt.StepTensors({0});
  const std::vector<TensorBytes> after = CaptureAll(opt);
  EXPECT_NE(after[0].param, before[0].param);
  EXPECT_EQ(after[1], before[1]) << "StepTensors({0}) changed tensor 1";
}

TEST(Optimizer, BadTensorIndicesThrowAndChangeNothing) {
  Adam opt({{.lr = 0.1}}, {{100, 0}, {50, 0}, {70, 0}});
  std::mt19937 rng(5);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
  opt.Step();
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

TEST(Optimizer, InvalidLrThrowsAndChangesNothing) {
  Adam opt({{.lr = 0.01}, {.lr = 0.02}}, {{300, 0}, {40000, 1}});
  std::mt19937 rng(13);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng);
  opt.Step();
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
  const std::array<std::size_t, 1> only0 = {
      0};  // tensor 0's group is valid, the check is still global
  EXPECT_THROW(opt.StepTensors(only0), Error);
  EXPECT_EQ(CaptureAll(opt), before);
  EXPECT_EQ(StepCounts(opt, 2), (std::vector<std::int64_t>{1, 1}));

  // Fixing the lr resumes from the same state: the next step is the second.
  opt.group(1).lr = 0.02;
  opt.Step();
  EXPECT_EQ(StepCounts(opt, 2), (std::vector<std::int64_t>{2, 2}));
}

TEST(Optimizer, InvalidHyperInConstructorThrows) {
  EXPECT_THROW(Adam({{.lr = -1.0}}, {{10, 0}}), Error);
  EXPECT_THROW(SGD({{.nesterov = true}}, {{10, 0}}), Error);
  EXPECT_THROW(Adam({{}}, {{10, 1}}), Error);  // group out of range
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: state allocation.

TEST(Optimizer, AdagradSumStartsAtInitialAccumulatorValue) {
  Adagrad opt({{.initial_accumulator_value = 0.5}, {.initial_accumulator_value = 0.1}},
              {{100, 1}, {33, 0}, {40000, 1}});
  for (std::size_t i = 0; i < 3; ++i) {
    const float want = opt.storage().segments()[i].group == 0 ? 0.5f : static_cast<float>(0.1);
    for (float x : opt.storage().state<float>(i, kSum)) ASSERT_EQ(x, want) << "tensor " << i;
  }
  Adagrad half({{.initial_accumulator_value = 0.1}}, {{64, 0}}, {.state_dtype = DType::kBF16});
  for (std::uint16_t x : half.storage().state<std::uint16_t>(0, kSum)) {
    ASSERT_EQ(x, F32ToBF16(static_cast<float>(0.1)));
  }
}

TEST(Optimizer, SgdWithoutMomentumHasNoMomentumBuffer) {
  SGD plain({{.lr = 0.1}}, {{100, 0}, {10, 0}});
  for (const Segment& s : plain.storage().segments()) {
    for (int k = 0; k < kMaxStates; ++k) EXPECT_EQ(s.state[k], nullptr);
  }
  SGD momentum({{.lr = 0.1, .momentum = 0.9}}, {{100, 0}});
  EXPECT_NE(momentum.storage().segments()[0].state[kMomentumBuffer], nullptr);
}

TEST(Optimizer, StateSlotsFollowRequiredStates) {
  Adam adam({{}}, {{10, 0}});
  EXPECT_NE(adam.storage().segments()[0].state[kExpAvg], nullptr);
  EXPECT_NE(adam.storage().segments()[0].state[kExpAvgSq], nullptr);
  EXPECT_EQ(adam.storage().segments()[0].state[kMaxExpAvgSq], nullptr);
  Adam ams({{.amsgrad = true}}, {{10, 0}});
  EXPECT_NE(ams.storage().segments()[0].state[kMaxExpAvgSq], nullptr);
  RMSprop centered({{.centered = true}}, {{10, 0}});
  EXPECT_NE(centered.storage().segments()[0].state[kSquareAvg], nullptr);
  EXPECT_EQ(centered.storage().segments()[0].state[kRmspropMomentumBuffer], nullptr);
  EXPECT_NE(centered.storage().segments()[0].state[kGradAvg], nullptr);
}

TEST(Optimizer, StateViewsRejectMissingSlots) {
  SGD plain({{.lr = 0.1}}, {{10, 0}});
  EXPECT_THROW(plain.storage().state<float>(0, kMomentumBuffer), Error);
  Adam adam({{}}, {{10, 0}});
  EXPECT_EQ(adam.storage().state<float>(0, kExpAvg).size(), 10u);
  EXPECT_THROW(adam.storage().state<float>(0, kMaxExpAvgSq), Error);
  EXPECT_THROW(adam.storage().state<float>(0, -1), Error);
  EXPECT_THROW(adam.storage().state<float>(0, kMaxStates), Error);
}

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

// torch starts a momentum buffer as a copy of the gradient on its first momentum step (no
// dampening), also when momentum is switched on after earlier plain steps.
TEST(Optimizer, SgdMomentumSwitchedOnLaterStartsFromTheGradient) {
  SGD sgd({{.lr = 0.5}}, {{3, 0}});
  std::ranges::fill(sgd.storage().grads<float>(0), 2.0f);
  sgd.Step();  // plain: p = 0 - 0.5·2 = -1
  sgd.group(0).momentum = 0.9;
  sgd.group(0).dampening = 0.5;
  sgd.Step();  // buf = g = 2 (no dampening on the first momentum step); p = -1 - 0.5·2 = -2
  EXPECT_EQ(sgd.storage().state<float>(0, kMomentumBuffer)[0], 2.0f);
  EXPECT_EQ(sgd.storage().params<float>(0)[0], -2.0f);
  sgd.Step();  // buf = 0.9·2 + 0.5·2 = 2.8; p = -2 - 1.4 = -3.4
  EXPECT_FLOAT_EQ(sgd.storage().state<float>(0, kMomentumBuffer)[0], 2.8f);
  EXPECT_FLOAT_EQ(sgd.storage().params<float>(0)[0], -3.4f);
}

// LARS keeps SGD's momentum buffer, started the same way: a copy of the (scaled) gradient on its
// first momentum step.
TEST(Optimizer, LarsMomentumSwitchedOnLaterStartsFromTheGradient) {
  LARS lars({{.lr = 0.5}}, {{3, 0}});
  std::ranges::fill(lars.storage().grads<float>(0), 2.0f);
  lars.Step();  // ‖p‖ = 0: no trust ratio, p = 0 - 0.5·2 = -1
  EXPECT_EQ(lars.storage().params<float>(0)[0], -1.0f);
  lars.group(0).momentum = 0.9;
  lars.group(0).dampening = 0.5;
  lars.Step();  // rate = 0.02·√3 / (2√3 + 1e-8), clip: rate / 0.5; buf = 2·that (no dampening)
  const float param_norm = std::sqrt(3.0f);
  const float grad_norm = 2.0f * std::sqrt(3.0f);
  const float rate = 0.02f * param_norm / (grad_norm + param_norm * 0.0f + 1e-8f) / 0.5f;
  const float d = (2.0f + 0.0f * -1.0f) * rate;
  EXPECT_FLOAT_EQ(lars.storage().state<float>(0, kLarsMomentumBuffer)[0], d);
  EXPECT_FLOAT_EQ(lars.storage().params<float>(0)[0], -1.0f - 0.5f * d);
}

// Optimizer<AdampHyper> hands TensorSpec::rows to the step: a (8, 8) tensor is projected per
// channel (delta 10), exactly as the raw step on a segment with rows 8; without rows it is not.
TEST(Optimizer, AdampTakesTheChannelRowsOfTensorSpec) {
  const AdampHyper h{.lr = 1e-2, .weight_decay = 0.1, .delta = 10.0};
  AdamP with_rows({h}, {{.numel = 64, .rows = 8}});
  AdamP flat({h}, {{.numel = 64}});
  std::vector<float> p(64), g(64), m(64, 0.0f), v(64, 0.0f);
  for (std::size_t i = 0; i < 64; ++i) {
    p[i] = std::sin(static_cast<float>(i) + 0.5f);
    g[i] = std::cos(3.0f * static_cast<float>(i));
  }
  for (AdamP* opt : {&with_rows, &flat}) {
    std::ranges::copy(p, opt->storage().params<float>(0).begin());
    std::ranges::copy(g, opt->storage().grads<float>(0).begin());
    opt->Step();
  }
  Segment raw{.param = p.data(), .grad = g.data(), .numel = 64, .rows = 8};
  raw.state[kAdampExpAvg] = m.data();
  raw.state[kAdampExpAvgSq] = v.data();
  AdampStep(std::span<const AdampHyper>(&h, 1), std::span<const Segment>(&raw, 1));
  EXPECT_TRUE(std::ranges::equal(with_rows.storage().params<float>(0), p));
  EXPECT_FALSE(std::ranges::equal(flat.storage().params<float>(0), p));
}

// Optimizer<AdafactorHyper> hands TensorSpec::rows and cols to the step: a batch of two (4, 8)
// matrices is factored, exactly as the raw step on a segment with rows 4 and cols 8 (row_var 8
// values, col_var 16); as a vector (no rows or cols) it is not.
TEST(Optimizer, AdafactorTakesTheShapeOfTensorSpec) {
  const AdafactorHyper h{.lr = 0.5, .weight_decay = 0.1};
  Adafactor factored({h}, {{.numel = 64, .rows = 4, .cols = 8}});
  Adafactor flat({h}, {{.numel = 64}});
  std::vector<float> p(64), g(64), row(8, 0.0f), col(16, 0.0f);
  for (std::size_t i = 0; i < 64; ++i) {
    p[i] = std::sin(static_cast<float>(i) + 0.5f);
    g[i] = std::cos(3.0f * static_cast<float>(i));
  }
  for (Adafactor* opt : {&factored, &flat}) {
    std::ranges::copy(p, opt->storage().params<float>(0).begin());
    std::ranges::copy(g, opt->storage().grads<float>(0).begin());
    opt->Step();
  }
  Segment raw{.param = p.data(), .grad = g.data(), .numel = 64, .rows = 4, .cols = 8};
  raw.state[kAdafactorRowVar] = row.data();
  raw.state[kAdafactorColVar] = col.data();
  AdafactorStep(std::span<const AdafactorHyper>(&h, 1), std::span<const Segment>(&raw, 1));
  EXPECT_TRUE(std::ranges::equal(factored.storage().params<float>(0), p));
  EXPECT_TRUE(
      std::ranges::equal(factored.storage().state<float>(0, kAdafactorRowVar).first(8), row));
  EXPECT_TRUE(
      std::ranges::equal(factored.storage().state<float>(0, kAdafactorColVar).first(16), col));
  EXPECT_FALSE(std::ranges::equal(flat.storage().params<float>(0), p));
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: master weights.

TEST(Optimizer, MasterWeightsWithBf16Params) {
  const AdamHyper h{.lr = 1e-2, .weight_decay = 0.01};
  const std::vector<TensorSpec> specs = {{1000, 0}, {40000, 0}};
  Adam opt({h}, specs, {.param_dtype = DType::kBF16, .master_weights = true});
  // The same tensors as f32 params, no master: the master path must compute exactly this.
  Adam ref({h}, specs);
  std::mt19937 rng(17);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::span<std::uint16_t> p = opt.storage().params<std::uint16_t>(i);
    FillRandom(p.data(), DType::kBF16, p.size(), rng);
    std::span<float> r = ref.storage().params<float>(i);
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
      std::span<const float> want = ref.storage().params<float>(i);
      ASSERT_TRUE(SameBytes(master.data(), want.data(), master.size_bytes()))
          << "master of tensor " << i;
      std::span<const std::uint16_t> p = opt.storage().params<std::uint16_t>(i);
      for (std::size_t k = 0; k < p.size(); ++k) {
        ASSERT_EQ(p[k], F32ToBF16(master[k])) << "tensor " << i << " element " << k;
      }
    }
  }
}

// A rejected first step must not seed the master copy either.
TEST(Optimizer, RejectedFirstStepLeavesMasterUntouched) {
  Adam opt({{.lr = 1e-2}}, {{4, 0}}, {.param_dtype = DType::kBF16, .master_weights = true});
  std::ranges::fill(opt.storage().params<std::uint16_t>(0), F32ToBF16(1.5f));
  opt.group(0).lr = -1.0;
  EXPECT_THROW(opt.Step(), Error);
  for (float m : opt.storage().master(0)) EXPECT_EQ(m, 0.0f);
  EXPECT_EQ(opt.step_count(0), 0);
  opt.group(0).lr = 1e-2;
  opt.Step();
  EXPECT_NEAR(opt.storage().master(0)[0], 1.5f, 0.02f);
}

TEST(Optimizer, MasterWeightsWithF32ParamsThrows) {
  EXPECT_THROW(Adam({{}}, {{10, 0}}, {.master_weights = true}), Error);
  EXPECT_THROW(SGD({{}}, {{10, 0}}, {.param_dtype = DType::kF32, .master_weights = true}), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Optimizer: threads.

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

TEST(Optimizer, OneAndTwoThreadsGiveIdenticalBits) {
  ExpectThreadCountInvariant(AdamHyper{.lr = 1e-2, .amsgrad = true});
  ExpectThreadCountInvariant(SgdHyper{.lr = 0.1, .momentum = 0.9});
  ExpectThreadCountInvariant(RmspropHyper{.centered = true});
  ExpectThreadCountInvariant(AdagradHyper{.lr_decay = 0.01});
}

TEST(Optimizer, ZeroGradZeroesGradsOnly) {
  AdamW opt({{}}, {{100, 0}, {20, 0}});
  std::mt19937 rng(23);
  FillRandom(opt.storage().flat_params(), DType::kF32, opt.storage().total_numel(), rng);
  FillRandom(opt.storage().flat_grads(), DType::kF32, opt.storage().total_numel(), rng, 0.5f, 1.0f);
  const Bytes params = Copy(opt.storage().flat_params(), opt.storage().total_numel() * 4);
  opt.ZeroGrad();
  for (std::size_t i = 0; i < 2; ++i) {
    for (float g : opt.storage().grads<float>(i)) ASSERT_EQ(g, 0.0f);
  }
  EXPECT_EQ(Copy(opt.storage().flat_params(), opt.storage().total_numel() * 4), params);
}

// Optimizer<NadamHyper> keeps each tensor's mu_product (FlatStorage::scalars), starting at 1 and
// advanced by every step as torch's f32 state: f32(mu_product · f32(mu_t)).
TEST(Optimizer, NadamKeepsMuProductPerTensor) {
  const NadamHyper h{.lr = 1e-2, .momentum_decay = 0.02};
  NAdam opt({h}, {{100, 0}, {0, 0}, {7, 0}});
  for (std::size_t i = 0; i < opt.storage().num_tensors(); ++i) {
    EXPECT_EQ(*opt.storage().segments()[i].scalars[kNadamMuProduct], 1.0f);
  }
  float expected = 1.0f;
  for (int step = 1; step <= 3; ++step) {
    for (std::size_t i = 0; i < opt.storage().num_tensors(); ++i) {
      const Segment& s = opt.storage().segments()[i];
      for (std::size_t k = 0; k < s.numel; ++k)
        static_cast<float*>(const_cast<void*>(s.grad))[k] = 0.5f;
    }
    opt.Step();
    expected *= static_cast<float>(
        h.beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(step) * h.momentum_decay)));
    for (std::size_t i = 0; i < opt.storage().num_tensors(); ++i) {
      EXPECT_EQ(*opt.storage().segments()[i].scalars[kNadamMuProduct], expected)
          << "tensor " << i << ", step " << step;
    }
  }
}

// Optimizer<AsgdHyper> keeps each tensor's eta and mu (FlatStorage::scalars), starting at f32(lr)
// and 1 as torch's state, and advanced by every step: eta = f32(lr / (1 + lambd·lr·t)^alpha),
// mu = f32(1 / max(1, t − t0)).
TEST(Optimizer, AsgdKeepsEtaAndMuPerTensor) {
  const AsgdHyper h{.lr = 0.03, .lambd = 0.1, .t0 = 1.0};
  ASGD opt({h}, {{100, 0}, {0, 0}, {7, 0}});
  for (std::size_t i = 0; i < opt.storage().num_tensors(); ++i) {
    EXPECT_EQ(*opt.storage().segments()[i].scalars[kAsgdEta], 0.03f);
    EXPECT_EQ(*opt.storage().segments()[i].scalars[kAsgdMu], 1.0f);
  }
  for (int step = 1; step <= 4; ++step) {
    for (std::size_t i = 0; i < opt.storage().num_tensors(); ++i) {
      const Segment& s = opt.storage().segments()[i];
      for (std::size_t k = 0; k < s.numel; ++k)
        static_cast<float*>(const_cast<void*>(s.grad))[k] = 0.5f;
    }
    opt.Step();
    const auto t = static_cast<double>(step);
    const auto eta = static_cast<float>(h.lr / std::pow(1.0 + h.lambd * h.lr * t, h.alpha));
    const float mu = t - h.t0 > 1.0 ? static_cast<float>(1.0 / (t - h.t0)) : 1.0f;
    for (std::size_t i = 0; i < opt.storage().num_tensors(); ++i) {
      EXPECT_EQ(*opt.storage().segments()[i].scalars[kAsgdEta], eta) << "tensor " << i;
      EXPECT_EQ(*opt.storage().segments()[i].scalars[kAsgdMu], mu) << "tensor " << i;
    }
  }
}

// Optimizer<RpropHyper> starts each tensor's step_size at its group's lr and prev at 0, as torch's
// full_like(grad, lr) and zeros_like(p); a first step with prev 0 keeps every step size (factor 1)
// and moves the param by -sign(g)·lr.
TEST(Optimizer, RpropStartsStepSizesAtTheGroupsLr) {
  const RpropHyper a{.lr = 0.25};
  const RpropHyper b{.lr = 0.125, .etaminus = 0.25};
  Rprop opt({a, b}, {{5, 0}, {3, 1}});
  const float lr[] = {0.25f, 0.125f};
  for (std::size_t i = 0; i < 2; ++i) {
    for (const float x : opt.storage().state<float>(i, kRpropStepSize)) EXPECT_EQ(x, lr[i]);
    for (const float x : opt.storage().state<float>(i, kRpropPrev)) EXPECT_EQ(x, 0.0f);
    for (float& g : opt.storage().grads<float>(i)) g = -0.5f;
    for (float& p : opt.storage().params<float>(i)) p = 1.0f;
  }
  opt.Step();
  for (std::size_t i = 0; i < 2; ++i) {
    for (const float x : opt.storage().state<float>(i, kRpropStepSize)) EXPECT_EQ(x, lr[i]);
    for (const float x : opt.storage().state<float>(i, kRpropPrev)) EXPECT_EQ(x, -0.5f);
    for (const float p : opt.storage().params<float>(i)) EXPECT_EQ(p, 1.0f + lr[i]);
  }
}

}  // namespace
}  // namespace fusedopt
