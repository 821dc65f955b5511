// Argument checks of the public API (step.h, runtime.h, convert.h): every rejected call throws
// fusedopt::Error naming the offending field and value, and leaves every buffer it was given
// bit-identical, including those of the valid segments listed before the bad one.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/convert.h"
#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"

namespace fusedopt {
namespace {

static_assert(std::is_base_of_v<std::invalid_argument, Error>);

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The buffers of a few f32 segments, filled with non-zero values, and snapshots of all of them.
class Model {
 public:
  // Adds a segment of `numel` f32 elements in `group` with a param, a grad and each state slot in
  // `slots`. The reference is valid until the next Add.
  Segment& Add(std::size_t numel, std::uint32_t group, unsigned slots) {
    Segment s;
    s.numel = numel;
    s.group = group;
    s.param = NewBuffer(numel);
    s.grad = NewBuffer(numel);
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if ((slots >> slot & 1u) != 0) s.state[slot] = NewBuffer(numel);
    }
    for (float*& scalar : s.scalars) scalar = NewBuffer(1);  // used by NAdam and ASGD only
    segments_.push_back(s);
    return segments_.back();
  }

  float* NewBuffer(std::size_t numel) {
    std::vector<float>& b = buffers_.emplace_back(numel);
    std::uniform_real_distribution<float> dist(0.25f, 0.75f);
    for (float& x : b) x = dist(rng_);
    return b.data();
  }

  std::span<const Segment> segments() const { return segments_; }
  Segment& segment(std::size_t i) { return segments_.at(i); }

  std::vector<std::vector<float>> Snapshot() const { return buffers_; }
  // Bit-identical to the snapshot (every buffer of every segment)?
  bool Unchanged(const std::vector<std::vector<float>>& before) const {
    if (before.size() != buffers_.size()) return false;
    for (std::size_t i = 0; i < before.size(); ++i) {
      if (before[i].size() != buffers_[i].size()) return false;
      if (before[i].empty()) continue;  // data() may be null, which memcmp must not get
      if (std::memcmp(before[i].data(), buffers_[i].data(), before[i].size() * sizeof(float)) !=
          0) {
        return false;
      }
    }
    return true;
  }

 private:
  std::mt19937 rng_{1234};
  std::vector<std::vector<float>>
      buffers_;  // inner data pointers survive reallocation of the outer vector
  std::vector<Segment> segments_;
};

// Calls `call`, which must throw fusedopt::Error whose message contains every needle, and checks
// that no buffer of `model` changed.
void ExpectRejected(const Model& model, const std::function<void()>& call,
                    const std::vector<std::string>& needles) {
  const auto before = model.Snapshot();
  try {
    call();
    ADD_FAILURE() << "no exception thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(msg.find(needle), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << needle << "\"";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than fusedopt::Error: " << e.what();
  }
  EXPECT_TRUE(model.Unchanged(before)) << "a rejected call changed a buffer";
}

// The step function of each hyper-parameter struct, so tests can be written once for all
// algorithms.
void RawStep(std::span<const SgdHyper> g, std::span<const Segment> s) { SgdStep(g, s); }
void RawStep(std::span<const AdamHyper> g, std::span<const Segment> s) { AdamStep(g, s); }
void RawStep(std::span<const AdamWHyper> g, std::span<const Segment> s) { AdamWStep(g, s); }
void RawStep(std::span<const RmspropHyper> g, std::span<const Segment> s) { RmspropStep(g, s); }
void RawStep(std::span<const AdagradHyper> g, std::span<const Segment> s) { AdagradStep(g, s); }
void RawStep(std::span<const LionHyper> g, std::span<const Segment> s) { LionStep(g, s); }
void RawStep(std::span<const LambHyper> g, std::span<const Segment> s) { LambStep(g, s); }
void RawStep(std::span<const AdamaxHyper> g, std::span<const Segment> s) { AdamaxStep(g, s); }
void RawStep(std::span<const AdadeltaHyper> g, std::span<const Segment> s) { AdadeltaStep(g, s); }
void RawStep(std::span<const RadamHyper> g, std::span<const Segment> s) { RadamStep(g, s); }
void RawStep(std::span<const NadamHyper> g, std::span<const Segment> s) { NadamStep(g, s); }
void RawStep(std::span<const RmsproptfHyper> g, std::span<const Segment> s) { RmsproptfStep(g, s); }
void RawStep(std::span<const AsgdHyper> g, std::span<const Segment> s) { AsgdStep(g, s); }
void RawStep(std::span<const LarsHyper> g, std::span<const Segment> s) { LarsStep(g, s); }
void RawStep(std::span<const RpropHyper> g, std::span<const Segment> s) { RpropStep(g, s); }
void RawStep(std::span<const AdampHyper> g, std::span<const Segment> s) { AdampStep(g, s); }
void RawStep(std::span<const BertAdamHyper> g, std::span<const Segment> s) { BertAdamStep(g, s); }
void RawStep(std::span<const AdafactorHyper> g, std::span<const Segment> s) { AdafactorStep(g, s); }

template <class Hyper>
const char* StepName() {
  if constexpr (std::is_same_v<Hyper, SgdHyper>) return "SgdStep";
  if constexpr (std::is_same_v<Hyper, AdamHyper>) return "AdamStep";
  if constexpr (std::is_same_v<Hyper, AdamWHyper>) return "AdamWStep";
  if constexpr (std::is_same_v<Hyper, RmspropHyper>) return "RmspropStep";
  if constexpr (std::is_same_v<Hyper, AdagradHyper>) return "AdagradStep";
  if constexpr (std::is_same_v<Hyper, LionHyper>) return "LionStep";
  if constexpr (std::is_same_v<Hyper, LambHyper>) return "LambStep";
  if constexpr (std::is_same_v<Hyper, AdamaxHyper>) return "AdamaxStep";
  if constexpr (std::is_same_v<Hyper, AdadeltaHyper>) return "AdadeltaStep";
  if constexpr (std::is_same_v<Hyper, RadamHyper>) return "RadamStep";
  if constexpr (std::is_same_v<Hyper, NadamHyper>) return "NadamStep";
  if constexpr (std::is_same_v<Hyper, RmsproptfHyper>) return "RmsproptfStep";
  if constexpr (std::is_same_v<Hyper, AsgdHyper>) return "AsgdStep";
  if constexpr (std::is_same_v<Hyper, LarsHyper>) return "LarsStep";
  if constexpr (std::is_same_v<Hyper, RpropHyper>) return "RpropStep";
  if constexpr (std::is_same_v<Hyper, AdampHyper>) return "AdampStep";
  if constexpr (std::is_same_v<Hyper, BertAdamHyper>) return "BertAdamStep";
  if constexpr (std::is_same_v<Hyper, AdafactorHyper>) return "AdafactorStep";
}

// Two valid segments in group 0 (one spans several chunks), then segment 2 (64 elements) in group
// 1, each with every state slot its group needs.
template <class Hyper>
Model MakeModel(const Hyper& group0, const Hyper& group1) {
  Model m;
  m.Add(1000, 0, RequiredStates(group0));
  m.Add(70000, 0, RequiredStates(group0));
  m.Add(64, 1, RequiredStates(group1));
  return m;
}

// Group 1 holds the invalid hyper-parameters `bad`; group 0 and its segments are valid.
template <class Hyper>
void ExpectBadGroup(const Hyper& bad, std::initializer_list<std::string> needles) {
  SCOPED_TRACE(StepName<Hyper>());
  const std::vector<Hyper> groups = {Hyper{}, bad};
  Model m =
      MakeModel(groups[0], groups[0]);  // slots of a valid group: the hyper check must come first
  std::vector<std::string> all(needles);
  all.emplace_back(StepName<Hyper>());
  all.emplace_back("group 1");
  ExpectRejected(
      m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); }, all);
}

// The valid form of each test model really is updated, so Unchanged() above means something.
TEST(Validation, ValidCallChangesBuffers) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  const auto before = m.Snapshot();
  const std::vector<AdamHyper> groups(2);
  AdamStep(groups, m.segments());
  EXPECT_FALSE(m.Unchanged(before));
}

TEST(Validation, ErrorIsInvalidArgument) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  const std::vector<AdamHyper> groups = {AdamHyper{}, AdamHyper{.lr = -1.0}};
  EXPECT_THROW(AdamStep(groups, m.segments()), std::invalid_argument);
}

TEST(Validation, NegativeLr) {
  ExpectBadGroup(SgdHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdamHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdamWHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(RmspropHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdagradHyper{.lr = -0.5}, {"lr", "-0.5"});
}

TEST(Validation, NanLr) {
  ExpectBadGroup(SgdHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdamHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdamWHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(RmspropHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdagradHyper{.lr = kNaN}, {"lr", "nan"});
}

TEST(Validation, ZeroLrIsAccepted) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  const std::vector<AdamHyper> groups = {AdamHyper{.lr = 0.0}, AdamHyper{.lr = 0.0}};
  EXPECT_NO_THROW(AdamStep(groups, m.segments()));
}

TEST(Validation, NegativeEps) {
  ExpectBadGroup(AdamHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(AdamWHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(RmspropHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(AdagradHyper{.eps = -0.25}, {"eps", "-0.25"});
}

TEST(Validation, BetaOneIsRejected) {
  ExpectBadGroup(AdamHyper{.beta1 = 1.0}, {"beta1: 1"});
  ExpectBadGroup(AdamWHyper{.beta1 = 1.0}, {"beta1: 1"});
  ExpectBadGroup(AdamHyper{.beta2 = 1.0}, {"beta2: 1"});
}

TEST(Validation, NegativeBeta) {
  ExpectBadGroup(AdamHyper{.beta2 = -0.1}, {"beta2", "-0.1"});
  ExpectBadGroup(AdamWHyper{.beta2 = -0.1}, {"beta2", "-0.1"});
  ExpectBadGroup(AdamHyper{.beta1 = -0.1}, {"beta1", "-0.1"});
}

TEST(Validation, NegativeWeightDecay) {
  ExpectBadGroup(SgdHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(AdamHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(AdamWHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(RmspropHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(AdagradHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
}

TEST(Validation, NegativeMomentum) {
  ExpectBadGroup(SgdHyper{.momentum = -0.5}, {"momentum", "-0.5"});
  ExpectBadGroup(RmspropHyper{.momentum = -0.5}, {"momentum", "-0.5"});
}

TEST(Validation, NesterovWithoutMomentum) {
  ExpectBadGroup(SgdHyper{.momentum = 0.0, .nesterov = true}, {"Nesterov", "momentum 0"});
}

TEST(Validation, NesterovWithDampening) {
  ExpectBadGroup(SgdHyper{.momentum = 0.9, .dampening = 0.5, .nesterov = true},
                 {"Nesterov", "dampening 0.5"});
}

TEST(Validation, NesterovWithMomentumAndNoDampeningIsAccepted) {
  const SgdHyper h{.momentum = 0.9, .nesterov = true};
  Model m = MakeModel(h, h);
  const std::vector<SgdHyper> groups = {h, h};
  EXPECT_NO_THROW(SgdStep(groups, m.segments()));
}

TEST(Validation, RmspropNegativeAlpha) {
  ExpectBadGroup(RmspropHyper{.alpha = -0.5}, {"alpha", "-0.5"});
}

TEST(Validation, RmspropAlphaAboveOneIsAccepted) {  // torch checks only alpha >= 0
  const RmspropHyper h{.alpha = 1.5};
  Model m = MakeModel(h, h);
  const std::vector<RmspropHyper> groups = {h, h};
  EXPECT_NO_THROW(RmspropStep(groups, m.segments()));
}

TEST(Validation, AdagradNegativeLrDecay) {
  ExpectBadGroup(AdagradHyper{.lr_decay = -0.5}, {"lr_decay", "-0.5"});
}

TEST(Validation, AdagradNegativeInitialAccumulatorValue) {
  ExpectBadGroup(AdagradHyper{.initial_accumulator_value = -0.5},
                 {"initial_accumulator_value", "-0.5"});
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// Lion: lr >= 0 (lion-pytorch asserts lr > 0 in its constructor only), betas in [0, 1] (1 allowed,
// as lion-pytorch's assert), a finite weight_decay (lion-pytorch does not check it; a non-finite
// one would poison every param).
TEST(Validation, LionRejectsBadHyperParameters) {
  ExpectBadGroup(LionHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(LionHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(LionHyper{.beta1 = -0.1}, {"beta1", "-0.1", "[0, 1]"});
  ExpectBadGroup(LionHyper{.beta1 = 1.5}, {"beta1", "1.5", "[0, 1]"});
  ExpectBadGroup(LionHyper{.beta1 = kNaN}, {"beta1", "nan"});
  ExpectBadGroup(LionHyper{.beta2 = -0.25}, {"beta2", "-0.25"});
  ExpectBadGroup(LionHyper{.beta2 = 1.25}, {"beta2", "1.25"});
  ExpectBadGroup(LionHyper{.weight_decay = kInf}, {"weight_decay", "inf"});
  ExpectBadGroup(LionHyper{.weight_decay = -kInf}, {"weight_decay", "-inf"});
  ExpectBadGroup(LionHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
}

// The edges lion-pytorch accepts: lr 0 (a schedule may reach it), betas 0 and 1, and a negative
// (finite) weight_decay, which it does not check either.
TEST(Validation, LionAcceptsTheEdges) {
  for (const LionHyper& h :
       {LionHyper{.lr = 0.0}, LionHyper{.beta1 = 1.0, .beta2 = 1.0},
        LionHyper{.beta1 = 0.0, .beta2 = 0.0}, LionHyper{.weight_decay = -0.5}}) {
    Model m = MakeModel(h, h);
    const std::vector<LionHyper> groups = {h, h};
    EXPECT_NO_THROW(LionStep(groups, m.segments()));
  }
}

// LAMB: lr >= 0, eps >= 0, betas in [0, 1), weight_decay >= 0 (tools/lamb_reference.py's checks).
TEST(Validation, LambRejectsBadHyperParameters) {
  ExpectBadGroup(LambHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(LambHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(LambHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(LambHyper{.eps = kNaN}, {"eps", "nan"});
  ExpectBadGroup(LambHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"});
  ExpectBadGroup(LambHyper{.beta1 = -0.1}, {"beta1", "-0.1"});
  ExpectBadGroup(LambHyper{.beta2 = 1.0}, {"beta2: 1", "[0, 1)"});
  ExpectBadGroup(LambHyper{.beta2 = -0.1}, {"beta2", "-0.1"});
  ExpectBadGroup(LambHyper{.beta2 = kNaN}, {"beta2", "nan"});
  ExpectBadGroup(LambHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(LambHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
}

TEST(Validation, LambAcceptsTheEdges) {
  for (const LambHyper& h :
       {LambHyper{.lr = 0.0}, LambHyper{.beta1 = 0.0, .beta2 = 0.0}, LambHyper{.eps = 0.0},
        LambHyper{.weight_decay = 0.0}, LambHyper{.weight_decay = 0.0, .use_nvlamb = true}}) {
    Model m = MakeModel(h, h);
    const std::vector<LambHyper> groups = {h, h};
    EXPECT_NO_THROW(LambStep(groups, m.segments()));
  }
}

// LARS: torch.optim.SGD's rules (lr, momentum, weight_decay >= 0, a finite dampening, Nesterov
// with momentum and no dampening) and trust_coefficient, eps >= 0.
TEST(Validation, LarsRejectsBadHyperParameters) {
  ExpectBadGroup(LarsHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(LarsHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(LarsHyper{.momentum = -0.5}, {"momentum", "-0.5"});
  ExpectBadGroup(LarsHyper{.dampening = kNaN}, {"dampening", "nan"});
  ExpectBadGroup(LarsHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(LarsHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
  ExpectBadGroup(LarsHyper{.trust_coefficient = -0.02}, {"trust_coefficient", "-0.02"});
  ExpectBadGroup(LarsHyper{.trust_coefficient = kNaN}, {"trust_coefficient", "nan"});
  ExpectBadGroup(LarsHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(LarsHyper{.eps = kNaN}, {"eps", "nan"});
  ExpectBadGroup(LarsHyper{.momentum = 0.0, .nesterov = true}, {"Nesterov", "momentum 0"});
  ExpectBadGroup(LarsHyper{.momentum = 0.9, .dampening = 0.5, .nesterov = true},
                 {"Nesterov", "dampening 0.5"});
}

// lr 0 in clip mode too (LARC's adaptive_lr / lr is +inf there, min(inf, 1) = 1; see the Python
// tests for the values), trust_coefficient and eps 0, and scale mode.
TEST(Validation, LarsAcceptsTheEdges) {
  for (const LarsHyper& h : {LarsHyper{.lr = 0.0}, LarsHyper{.lr = 0.0, .clip = false},
                             LarsHyper{.trust_coefficient = 0.0}, LarsHyper{.eps = 0.0},
                             LarsHyper{.momentum = 0.9, .nesterov = true},
                             LarsHyper{.momentum = 0.9, .dampening = 0.5}}) {
    Model m = MakeModel(h, h);
    const std::vector<LarsHyper> groups = {h, h};
    EXPECT_NO_THROW(LarsStep(groups, m.segments()));
  }
}

// AdamP: torch.optim.Adam's rules (lr, eps, weight_decay >= 0, betas in [0, 1)) and delta >= 0,
// a finite wd_ratio >= 0 (clovaai checks nothing).
TEST(Validation, AdampRejectsBadHyperParameters) {
  ExpectBadGroup(AdampHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdampHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdampHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"});
  ExpectBadGroup(AdampHyper{.beta2 = -0.1}, {"beta2", "-0.1"});
  ExpectBadGroup(AdampHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(AdampHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(AdampHyper{.delta = -0.1}, {"delta", "-0.1"});
  ExpectBadGroup(AdampHyper{.delta = kNaN}, {"delta", "nan"});
  ExpectBadGroup(AdampHyper{.wd_ratio = -0.5}, {"wd_ratio", "-0.5"});
  ExpectBadGroup(AdampHyper{.wd_ratio = std::numeric_limits<double>::infinity()},
                 {"wd_ratio", "inf"});
}

// BertAdam: NpuFusedBertAdam's constructor checks (lr >= 0; warmup -1 or in [0, 1); b1, b2 in
// [0, 1); e >= 0), a schedule code of the four, and what the reference cannot run: t_total 0 or
// another negative one than -1, a NaN max_grad_norm, a non-finite weight_decay.
TEST(Validation, BertAdamRejectsBadHyperParameters) {
  ExpectBadGroup(BertAdamHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(BertAdamHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(BertAdamHyper{.warmup = -0.5}, {"warmup", "-0.5"});
  ExpectBadGroup(BertAdamHyper{.warmup = 1.0}, {"warmup: 1", "[0, 1)"});
  ExpectBadGroup(BertAdamHyper{.warmup = kNaN}, {"warmup", "nan"});
  ExpectBadGroup(BertAdamHyper{.t_total = 0.0}, {"t_total: 0", "-1 or > 0"});
  ExpectBadGroup(BertAdamHyper{.t_total = -2.0}, {"t_total", "-2"});
  ExpectBadGroup(BertAdamHyper{.schedule = 4}, {"schedule code: 4"});
  ExpectBadGroup(BertAdamHyper{.schedule = -1}, {"schedule code: -1"});
  ExpectBadGroup(BertAdamHyper{.b1 = 1.0}, {"b1: 1", "[0, 1)"});
  ExpectBadGroup(BertAdamHyper{.b2 = -0.1}, {"b2", "-0.1"});
  ExpectBadGroup(BertAdamHyper{.e = -1e-6}, {"e", "-1e-06"});
  ExpectBadGroup(BertAdamHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
  ExpectBadGroup(BertAdamHyper{.max_grad_norm = kNaN}, {"max_grad_norm", "nan"});
}

// Unchecked by the reference and fine here: a negative weight decay (skipped: wd > 0 is the test),
// max_grad_norm <= 0 (no clipping), lr 0, warmup 0 and -1, e 0.
TEST(Validation, BertAdamAcceptsTheEdges) {
  for (const BertAdamHyper& h :
       {BertAdamHyper{.lr = 0.0, .warmup = 0.0, .t_total = 5}, BertAdamHyper{.e = 0.0},
        BertAdamHyper{.weight_decay = -0.1, .max_grad_norm = 0.0},
        BertAdamHyper{.t_total = 1e9, .schedule = kBertAdamWarmupPoly, .max_grad_norm = -1.0}}) {
    Model m = MakeModel(h, h);
    const std::vector<BertAdamHyper> groups = {h, h};
    EXPECT_NO_THROW(BertAdamStep(groups, m.segments()));
  }
}

// Segment::rows must divide numel (AdamP's channel rows); 0 (a 1-D param) and numel itself are
// fine, and the other algorithms ignore rows.
TEST(Validation, AdampRowsMustDivideNumel) {
  const std::vector<AdampHyper> groups = {AdampHyper{}, AdampHyper{}};
  Model m = MakeModel(groups[0], groups[1]);
  m.segment(2).rows = 3;  // 64 elements
  ExpectRejected(m, [&] { AdampStep(groups, m.segments()); },
                 {"AdampStep", "segment 2", "rows 3", "numel 64"});
  for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{8}, std::size_t{64}}) {
    m.segment(2).rows = rows;
    EXPECT_NO_THROW(AdampStep(groups, m.segments())) << rows;
  }
  Model sgd = MakeModel(SgdHyper{}, SgdHyper{});
  sgd.segment(2).rows = 3;
  const std::vector<SgdHyper> sgd_groups(2);
  EXPECT_NO_THROW(SgdStep(sgd_groups, sgd.segments()));
}

// Adafactor: torch's rules (lr, eps1, eps2, weight_decay >= 0, beta2_decay <= 0, d >= 1; NaN
// fails them all).
TEST(Validation, AdafactorRejectsBadHyperParameters) {
  ExpectBadGroup(AdafactorHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdafactorHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdafactorHyper{.beta2_decay = 0.25}, {"beta2_decay", "0.25", "<= 0"});
  ExpectBadGroup(AdafactorHyper{.beta2_decay = kNaN}, {"beta2_decay", "nan"});
  ExpectBadGroup(AdafactorHyper{.eps1 = -1e-3}, {"eps1", "-0.001"});
  ExpectBadGroup(AdafactorHyper{.eps2 = -2.0}, {"eps2", "-2"});
  ExpectBadGroup(AdafactorHyper{.d = 0.5}, {"invalid d: 0.5", ">= 1"});
  ExpectBadGroup(AdafactorHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
}

TEST(Validation, AdafactorAcceptsTheEdges) {
  const AdafactorHyper edge{
      .lr = 0.0, .beta2_decay = 0.0, .eps1 = 0.0, .eps2 = 0.0, .d = 1.0, .weight_decay = 0.0};
  const std::vector<AdafactorHyper> groups = {edge, AdafactorHyper{}};
  Model m = MakeModel(groups[0], groups[1]);
  EXPECT_NO_THROW(AdafactorStep(groups, m.segments()));
}

// A factored segment: rows and cols both set (and dividing numel) or both 0; numel > 0; with
// stochastic rounding, a valid global_offset; row_var and col_var for matrices, variance for
// vectors (the other slots may be null). Each rejection leaves every buffer as it was.
TEST(Validation, AdafactorSegments) {
  const std::vector<AdafactorHyper> groups = {AdafactorHyper{}, AdafactorHyper{.lr = 0.1}};
  const auto step = [&](const Model& m) { AdafactorStep(groups, m.segments()); };
  {
    Model m = MakeModel(groups[0], groups[1]);
    m.segment(2).rows = 4;  // 64 elements, cols 0
    ExpectRejected(m, [&] { step(m); }, {"AdafactorStep", "segment 2", "rows 4", "cols 0"});
    m.segment(2).rows = 0;
    m.segment(2).cols = 4;
    ExpectRejected(m, [&] { step(m); }, {"segment 2", "rows 0", "cols 4"});
    m.segment(2).rows = 3;
    ExpectRejected(m, [&] { step(m); }, {"segment 2", "rows 3", "cols 4", "numel 64"});
    m.segment(2).rows = 2;
    m.segment(2).cols = 8;  // a batch of 4 matrices of 2 x 8
    EXPECT_NO_THROW(step(m));
    m.segment(2).state[kAdafactorVariance] = nullptr;  // a matrix needs no variance
    EXPECT_NO_THROW(step(m));
    m.segment(2).state[kAdafactorColVar] = nullptr;
    ExpectRejected(m, [&] { step(m); }, {"segment 2", "state[1]", "col_var"});
  }
  {
    Model m = MakeModel(groups[0], groups[1]);
    m.segment(1).state[kAdafactorRowVar] = nullptr;  // a vector needs only variance
    m.segment(1).state[kAdafactorColVar] = nullptr;
    EXPECT_NO_THROW(step(m));
    m.segment(1).state[kAdafactorVariance] = nullptr;
    ExpectRejected(m, [&] { step(m); }, {"segment 1", "state[2]", "variance"});
  }
  {  // numel 0 (TrainingStep's up-front check): nothing is read or written, null buffers are fine
    Model m = MakeModel(groups[0], groups[1]);
    Segment& empty = m.segment(0);
    empty.numel = 0;
    empty.rows = 2;
    empty.cols = 3;
    empty.param = nullptr;
    empty.grad = nullptr;
    for (void*& state : empty.state) state = nullptr;
    const auto before = m.Snapshot();
    m.segment(1).numel = 0;
    m.segment(2).numel = 0;
    EXPECT_NO_THROW(step(m));
    EXPECT_TRUE(m.Unchanged(before));
  }
  {
    Model m = MakeModel(groups[0], groups[1]);
    // Stochastic rounding is checked as for every algorithm: room for the segment's indices after
    // global_offset (its factors' indices are fewer).
    m.segment(2).stochastic_rounding = true;
    m.segment(2).global_offset = std::numeric_limits<std::uint64_t>::max() - 10;
    ExpectRejected(m, [&] { step(m); }, {"AdafactorStep", "segment 2", "global_offset"});
    m.segment(2).global_offset = 0;
    EXPECT_NO_THROW(step(m));
  }
}

TEST(Validation, SegmentGroupOutOfRange) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  m.segment(2).group = 5;
  const std::vector<AdamHyper> groups = {AdamHyper{}, AdamHyper{}};
  ExpectRejected(m, [&] { AdamStep(groups, m.segments()); },
                 {"AdamStep", "segment 2", "group 5", "2 groups"});
}

TEST(Validation, SegmentGroupEqualToGroupCount) {
  Model m = MakeModel(SgdHyper{}, SgdHyper{});
  const std::vector<SgdHyper> groups = {SgdHyper{}};  // segment 2 is in group 1
  ExpectRejected(m, [&] { SgdStep(groups, m.segments()); }, {"segment 2", "group 1", "1 groups"});
}

TEST(Validation, NullParam) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  m.segment(2).param = nullptr;
  const std::vector<AdamHyper> groups(2);
  ExpectRejected(m, [&] { AdamStep(groups, m.segments()); }, {"segment 2", "param", "null", "64"});
}

TEST(Validation, NullGrad) {
  Model m = MakeModel(SgdHyper{}, SgdHyper{});
  m.segment(2).grad = nullptr;
  const std::vector<SgdHyper> groups(2);
  ExpectRejected(m, [&] { SgdStep(groups, m.segments()); }, {"segment 2", "grad", "null", "64"});
}

// A segment with numel 0 may have null param, grad and states; the others are still updated.
template <class Hyper>
void ExpectEmptyNullSegmentAccepted(const Hyper& h) {
  SCOPED_TRACE(StepName<Hyper>());
  Model m = MakeModel(h, h);
  Segment& empty = m.Add(0, 1, 0);
  empty.param = nullptr;
  empty.grad = nullptr;
  const auto before = m.Snapshot();
  const std::vector<Hyper> groups = {h, h};
  EXPECT_NO_THROW(RawStep(std::span<const Hyper>(groups), m.segments()));
  EXPECT_FALSE(m.Unchanged(before));
}

TEST(Validation, NullBuffersAreFineWithNumelZero) {
  ExpectEmptyNullSegmentAccepted(SgdHyper{.lr = 0.1, .momentum = 0.9});
  ExpectEmptyNullSegmentAccepted(AdamHyper{.amsgrad = true});
  ExpectEmptyNullSegmentAccepted(AdamWHyper{});
  ExpectEmptyNullSegmentAccepted(RmspropHyper{.momentum = 0.5, .centered = true});
  ExpectEmptyNullSegmentAccepted(AdagradHyper{});
  ExpectEmptyNullSegmentAccepted(LionHyper{});
  ExpectEmptyNullSegmentAccepted(LambHyper{});
  ExpectEmptyNullSegmentAccepted(AdamaxHyper{.weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(AdadeltaHyper{.weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(RadamHyper{.weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(NadamHyper{.weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(
      RmsproptfHyper{.weight_decay = 0.1, .momentum = 0.5, .centered = true});
  ExpectEmptyNullSegmentAccepted(AsgdHyper{.weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(LarsHyper{.momentum = 0.9, .weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(RpropHyper{.maximize = true});
  ExpectEmptyNullSegmentAccepted(AdampHyper{.weight_decay = 0.1});
  ExpectEmptyNullSegmentAccepted(BertAdamHyper{.t_total = 10});
}

// Segment 2 lacks state[slot], which `h` requires.
template <class Hyper>
void ExpectMissingState(const Hyper& h, int slot, std::initializer_list<std::string> needles) {
  SCOPED_TRACE(StepName<Hyper>());
  ASSERT_NE(RequiredStates(h) >> slot & 1u, 0u);
  Model m = MakeModel(h, h);
  m.segment(2).state[slot] = nullptr;
  const std::vector<Hyper> groups = {h, h};
  std::vector<std::string> all(needles);
  all.emplace_back("segment 2");
  all.emplace_back("state[" + std::to_string(slot) + "]");
  ExpectRejected(
      m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); }, all);
}

TEST(Validation, MissingState) {
  ExpectMissingState(AdamHyper{}, kExpAvg, {"exp_avg"});
  ExpectMissingState(AdamHyper{}, kExpAvgSq, {"exp_avg_sq"});
  ExpectMissingState(AdamHyper{.amsgrad = true}, kMaxExpAvgSq, {"max_exp_avg_sq"});
  ExpectMissingState(AdamWHyper{}, kExpAvgSq, {"exp_avg_sq"});
  ExpectMissingState(AdamWHyper{.amsgrad = true}, kMaxExpAvgSq, {"max_exp_avg_sq"});
  ExpectMissingState(SgdHyper{.momentum = 0.9}, kMomentumBuffer, {"momentum_buffer"});
  ExpectMissingState(RmspropHyper{}, kSquareAvg, {"square_avg"});
  ExpectMissingState(RmspropHyper{.centered = true}, kGradAvg, {"grad_avg"});
  ExpectMissingState(RmspropHyper{.momentum = 0.5}, kRmspropMomentumBuffer, {"momentum_buffer"});
  ExpectMissingState(AdagradHyper{}, kSum, {"sum"});
  ExpectMissingState(LionHyper{}, kLionExpAvg, {"exp_avg"});
  ExpectMissingState(LambHyper{}, kLambExpAvg, {"exp_avg"});
  ExpectMissingState(LambHyper{}, kLambExpAvgSq, {"exp_avg_sq"});
  ExpectMissingState(AdamaxHyper{}, kAdamaxExpAvg, {"exp_avg"});
  ExpectMissingState(AdamaxHyper{}, kExpInf, {"exp_inf"});
  ExpectMissingState(AdadeltaHyper{}, kAdadeltaSquareAvg, {"square_avg"});
  ExpectMissingState(AdadeltaHyper{}, kAccDelta, {"acc_delta"});
  ExpectMissingState(RadamHyper{}, kRadamExpAvg, {"exp_avg"});
  ExpectMissingState(RadamHyper{}, kRadamExpAvgSq, {"exp_avg_sq"});
  ExpectMissingState(NadamHyper{}, kNadamExpAvg, {"exp_avg"});
  ExpectMissingState(NadamHyper{}, kNadamExpAvgSq, {"exp_avg_sq"});
  ExpectMissingState(RmsproptfHyper{}, kRmsproptfSquareAvg, {"square_avg"});
  ExpectMissingState(RmsproptfHyper{.centered = true}, kRmsproptfGradAvg, {"grad_avg"});
  ExpectMissingState(RmsproptfHyper{.momentum = 0.5, .lr_in_momentum = false},
                     kRmsproptfMomentumBuffer, {"momentum_buffer"});
  ExpectMissingState(AsgdHyper{}, kAsgdAx, {"ax"});
  ExpectMissingState(LarsHyper{.momentum = 0.9}, kLarsMomentumBuffer, {"momentum_buffer"});
  ExpectMissingState(RpropHyper{}, kRpropPrev, {"prev"});
  ExpectMissingState(RpropHyper{}, kRpropStepSize, {"step_size"});
  ExpectMissingState(AdampHyper{}, kAdampExpAvg, {"exp_avg"});
  ExpectMissingState(AdampHyper{}, kAdampExpAvgSq, {"exp_avg_sq"});
  ExpectMissingState(BertAdamHyper{}, kBertAdamExpAvg, {"exp_avg"});
  ExpectMissingState(BertAdamHyper{.weight_decay = 0.0}, kBertAdamExpAvgSq, {"exp_avg_sq"});
}

// NAdam's scalar state (mu_product) is required for every segment, an empty one too.
TEST(Validation, MissingScalarState) {
  const std::vector<NadamHyper> groups = {NadamHyper{}, NadamHyper{}};
  for (std::size_t numel : {std::size_t{64}, std::size_t{0}}) {
    Model m = MakeModel(groups[0], groups[1]);
    Segment& last = m.Add(numel, 1, RequiredStates(groups[1]));
    last.scalars[kNadamMuProduct] = nullptr;
    ExpectRejected(m, [&] { NadamStep(groups, m.segments()); },
                   {"NadamStep", "segment 3", "scalars[0]", "mu_product", "null"});
  }
  // ASGD's two (eta and mu), each.
  const std::vector<AsgdHyper> asgd = {AsgdHyper{}, AsgdHyper{}};
  for (const int k : {kAsgdEta, kAsgdMu}) {
    Model m = MakeModel(asgd[0], asgd[1]);
    Segment& last = m.Add(0, 1, RequiredStates(asgd[1]));
    last.scalars[k] = nullptr;
    ExpectRejected(m, [&] { AsgdStep(asgd, m.segments()); },
                   {"AsgdStep", "segment 3", "scalars[" + std::to_string(k) + "]",
                    k == kAsgdEta ? "eta" : "mu", "null"});
  }
  // Another algorithm ignores them.
  Model m = MakeModel(RadamHyper{}, RadamHyper{});
  m.segment(2).scalars[0] = nullptr;
  const std::vector<RadamHyper> radam(2);
  EXPECT_NO_THROW(RadamStep(radam, m.segments()));
}

// A step writes the scalar state back only once its update ran: mu_product becomes
// f32(mu_product · f32(mu_t)), and a skipped (Inf gradient) or rejected call leaves it as it was.
TEST(Validation, ScalarStateAdvancesOnlyWithTheUpdate) {
  const NadamHyper h{.momentum_decay = 0.01};
  const std::vector<NadamHyper> groups = {h, h};
  Model m = MakeModel(h, h);
  for (std::size_t i = 0; i < 3; ++i) m.segment(i).step = static_cast<std::int64_t>(i) + 4;
  std::vector<float> old(3);
  for (std::size_t i = 0; i < 3; ++i) old[i] = *m.segment(i).scalars[kNadamMuProduct];
  // Skipped: one gradient holds Inf.
  std::vector<Segment> segs(m.segments().begin(), m.segments().end());
  const float saved = *static_cast<const float*>(segs[1].grad);
  *const_cast<float*>(static_cast<const float*>(segs[1].grad)) =
      std::numeric_limits<float>::infinity();
  Runtime runtime(2);
  const auto before = m.Snapshot();
  const StepResult skipped =
      TrainingStep(std::span<const NadamHyper>(groups), std::span<Segment>(segs),
                   {.check_overflow = true}, runtime);
  EXPECT_FALSE(skipped.stepped);
  EXPECT_TRUE(m.Unchanged(before));
  *const_cast<float*>(static_cast<const float*>(segs[1].grad)) = saved;
  // Rejected: an invalid group 1.
  const std::vector<NadamHyper> bad = {h, NadamHyper{.momentum_decay = -1.0}};
  ExpectRejected(m, [&] { NadamStep(bad, m.segments()); }, {"NadamStep", "momentum_decay"});
  // Taken: in two waves, and through the plain step.
  const StepResult taken =
      TrainingStep(std::span<const NadamHyper>(groups), std::span<Segment>(segs),
                   {.check_overflow = true, .wave_ends = std::vector<std::size_t>{1, 3}}, runtime);
  EXPECT_TRUE(taken.stepped);
  for (std::size_t i = 0; i < 3; ++i) {
    const double t = static_cast<double>(m.segment(i).step);
    const auto mu =
        static_cast<float>(h.beta1 * (1.0 - 0.5 * std::pow(0.96, t * h.momentum_decay)));
    EXPECT_EQ(*m.segment(i).scalars[kNadamMuProduct], old[i] * mu) << "segment " << i;
  }
}

// ASGD's eta and mu: a skipped or rejected step leaves them, a taken one leaves what torch's step t
// leaves: f32(lr / (1 + lambd·lr·t)^alpha) and f32(1 / max(1, t − t0)).
TEST(Validation, AsgdScalarStatesAdvanceOnlyWithTheUpdate) {
  const AsgdHyper h{.lr = 0.05, .lambd = 0.1, .t0 = 4.0};
  const std::vector<AsgdHyper> groups = {h, h};
  Model m = MakeModel(h, h);
  for (std::size_t i = 0; i < 3; ++i) m.segment(i).step = static_cast<std::int64_t>(i) + 4;
  std::vector<Segment> segs(m.segments().begin(), m.segments().end());
  const float saved = *static_cast<const float*>(segs[0].grad);
  *const_cast<float*>(static_cast<const float*>(segs[0].grad)) =
      std::numeric_limits<float>::quiet_NaN();
  Runtime runtime(2);
  const auto before = m.Snapshot();
  EXPECT_FALSE(TrainingStep(std::span<const AsgdHyper>(groups), std::span<Segment>(segs),
                            {.check_overflow = true}, runtime)
                   .stepped);
  EXPECT_TRUE(m.Unchanged(before));
  *const_cast<float*>(static_cast<const float*>(segs[0].grad)) = saved;
  const std::vector<AsgdHyper> bad = {h, AsgdHyper{.weight_decay = -1.0}};
  ExpectRejected(m, [&] { AsgdStep(bad, m.segments()); }, {"AsgdStep", "weight_decay"});
  AsgdStep(groups, m.segments(), runtime);
  for (std::size_t i = 0; i < 3; ++i) {
    const double t = static_cast<double>(m.segment(i).step);
    EXPECT_EQ(*m.segment(i).scalars[kAsgdEta],
              static_cast<float>(h.lr / std::pow(1.0 + h.lambd * h.lr * t, h.alpha)))
        << "segment " << i;
    EXPECT_EQ(*m.segment(i).scalars[kAsgdMu],
              t - h.t0 > 1.0 ? static_cast<float>(1.0 / (t - h.t0)) : 1.0f)
        << "segment " << i;
  }
}

// The required slots come from each segment's own group.
TEST(Validation, MissingStateIsCheckedAgainstTheSegmentsGroup) {
  {
    const std::vector<AdamHyper> groups = {AdamHyper{}, AdamHyper{.amsgrad = true}};
    Model m = MakeModel(groups[0], groups[1]);
    m.segment(2).state[kMaxExpAvgSq] = nullptr;
    ExpectRejected(m, [&] { AdamStep(groups, m.segments()); }, {"segment 2", "max_exp_avg_sq"});
  }
  {
    const std::vector<SgdHyper> groups = {SgdHyper{}, SgdHyper{.momentum = 0.9}};
    Model m = MakeModel(groups[0], groups[1]);
    m.segment(2).state[kMomentumBuffer] = nullptr;
    ExpectRejected(m, [&] { SgdStep(groups, m.segments()); }, {"segment 2", "momentum_buffer"});
  }
  {
    // Segment 2's group needs no max_exp_avg_sq, although group 0 does.
    const std::vector<AdamHyper> groups = {AdamHyper{.amsgrad = true}, AdamHyper{}};
    Model m = MakeModel(groups[0], groups[1]);
    ASSERT_EQ(m.segment(2).state[kMaxExpAvgSq], nullptr);
    EXPECT_NO_THROW(AdamStep(groups, m.segments()));
  }
}

TEST(Validation, StatesNotRequiredMayBeNull) {
  {
    Model m = MakeModel(AdamHyper{}, AdamHyper{});  // no max_exp_avg_sq without amsgrad
    const std::vector<AdamHyper> groups(2);
    EXPECT_NO_THROW(AdamStep(groups, m.segments()));
  }
  {
    Model m = MakeModel(SgdHyper{}, SgdHyper{});  // no momentum_buffer with momentum 0
    const std::vector<SgdHyper> groups(2);
    EXPECT_NO_THROW(SgdStep(groups, m.segments()));
  }
  {
    Model m = MakeModel(RmspropHyper{}, RmspropHyper{});  // square_avg only
    const std::vector<RmspropHyper> groups(2);
    EXPECT_NO_THROW(RmspropStep(groups, m.segments()));
  }
}

TEST(Validation, MasterCopyWithF32Param) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  m.segment(2).master = m.NewBuffer(64);
  const std::vector<AdamHyper> groups(2);
  ExpectRejected(m, [&] { AdamStep(groups, m.segments()); }, {"segment 2", "master", "f32"});
}

TEST(Validation, StepZero) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  m.segment(2).step = 0;
  const std::vector<AdamHyper> groups(2);
  ExpectRejected(m, [&] { AdamStep(groups, m.segments()); }, {"segment 2", "step: 0"});
}

TEST(Validation, NegativeStep) {
  Model m = MakeModel(SgdHyper{.momentum = 0.9}, SgdHyper{.momentum = 0.9});
  m.segment(2).step = -3;
  const std::vector<SgdHyper> groups(2, SgdHyper{.momentum = 0.9});
  ExpectRejected(m, [&] { SgdStep(groups, m.segments()); }, {"segment 2", "step", "-3"});
}

TEST(Validation, InvalidDTypeCode) {
  const auto bad = static_cast<DType>(7);
  for (int field = 0; field < 3; ++field) {
    SCOPED_TRACE(field);
    Model m = MakeModel(AdamHyper{}, AdamHyper{});
    Segment& s = m.segment(2);
    (field == 0 ? s.param_dtype : field == 1 ? s.grad_dtype : s.state_dtype) = bad;
    const std::vector<AdamHyper> groups(2);
    ExpectRejected(m, [&] { AdamStep(groups, m.segments()); }, {"segment 2", "dtype", "7"});
  }
}

TEST(Validation, SegmentsWithNoGroups) {
  Model m = MakeModel(AdamHyper{}, AdamHyper{});
  ExpectRejected(m, [&] { AdamStep({}, m.segments()); }, {"AdamStep", "no groups", "3 segments"});
  ExpectRejected(m, [&] { SgdStep({}, m.segments()); }, {"SgdStep", "no groups"});
  ExpectRejected(m, [&] { AdamWStep({}, m.segments()); }, {"AdamWStep", "no groups"});
  ExpectRejected(m, [&] { RmspropStep({}, m.segments()); }, {"RmspropStep", "no groups"});
  ExpectRejected(m, [&] { AdagradStep({}, m.segments()); }, {"AdagradStep", "no groups"});
  ExpectRejected(m, [&] { LionStep({}, m.segments()); }, {"LionStep", "no groups"});
  ExpectRejected(m, [&] { LambStep({}, m.segments()); }, {"LambStep", "no groups"});
  ExpectRejected(m, [&] { AdamaxStep({}, m.segments()); }, {"AdamaxStep", "no groups"});
  ExpectRejected(m, [&] { AdadeltaStep({}, m.segments()); }, {"AdadeltaStep", "no groups"});
  ExpectRejected(m, [&] { RadamStep({}, m.segments()); }, {"RadamStep", "no groups"});
  ExpectRejected(m, [&] { LarsStep({}, m.segments()); }, {"LarsStep", "no groups"});
  ExpectRejected(m, [&] { AdampStep({}, m.segments()); }, {"AdampStep", "no groups"});
}

TEST(Validation, NothingToDoIsAccepted) {
  EXPECT_NO_THROW(AdamStep({}, {}));
  const std::vector<SgdHyper> groups(1);
  EXPECT_NO_THROW(SgdStep(groups, {}));
}

TEST(Validation, RuntimeNegativeThreads) {
  try {
    Runtime r(-1);
    ADD_FAILURE() << "Runtime(-1) did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("num_threads"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-1"), std::string::npos) << msg;
  }
  Runtime r(3);
  EXPECT_THROW(r.set_num_threads(-2), Error);
  EXPECT_EQ(r.num_threads(), 3);  // a rejected setting changes nothing
  EXPECT_GE(Runtime(0).num_threads(), 1);
}

TEST(Validation, ForceTargetUnknownName) {
  const std::string active = ActiveTargetName();
  try {
    ForceTarget("NOPE");
    ADD_FAILURE() << "ForceTarget(\"NOPE\") did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NOPE"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ActiveTargetName(), active);
}

TEST(Validation, ConvertBufferNullWithElements) {
  std::vector<float> src(100, 1.5f);
  std::vector<std::uint16_t> dst(100, 0x1234);
  const std::vector<std::uint16_t> before = dst;
  try {
    ConvertBuffer(nullptr, DType::kF32, dst.data(), DType::kBF16, dst.size());
    ADD_FAILURE() << "null src did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ConvertBuffer(src.data(), DType::kF32, nullptr, DType::kBF16, src.size()), Error);
  EXPECT_EQ(dst, before);
  EXPECT_NO_THROW(ConvertBuffer(nullptr, DType::kF32, nullptr, DType::kBF16, 0));
}

TEST(Validation, ConvertBufferInvalidDType) {
  std::vector<float> src(16, 1.5f);
  std::vector<float> dst(16, 2.0f);
  EXPECT_THROW(ConvertBuffer(src.data(), static_cast<DType>(7), dst.data(), DType::kF32, 16),
               Error);
  EXPECT_THROW(ConvertBuffer(src.data(), DType::kF32, dst.data(), static_cast<DType>(7), 16),
               Error);
  EXPECT_EQ(dst, std::vector<float>(16, 2.0f));
}

TEST(Validation, RequiredStates) {
  EXPECT_EQ(RequiredStates(SgdHyper{}), 0u);
  EXPECT_EQ(RequiredStates(SgdHyper{.momentum = 0.9}), 0b001u);
  EXPECT_EQ(RequiredStates(SgdHyper{.momentum = 0.9, .nesterov = true}), 0b001u);

  EXPECT_EQ(RequiredStates(AdamHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(AdamHyper{.amsgrad = true}), 0b111u);
  EXPECT_EQ(RequiredStates(AdamHyper{.decoupled_weight_decay = true}), 0b011u);
  EXPECT_EQ(RequiredStates(AdamWHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(AdamWHyper{.amsgrad = true}), 0b111u);

  EXPECT_EQ(RequiredStates(RmspropHyper{}), 0b001u);
  EXPECT_EQ(RequiredStates(RmspropHyper{.momentum = 0.5}), 0b011u);
  EXPECT_EQ(RequiredStates(RmspropHyper{.centered = true}), 0b101u);
  EXPECT_EQ(RequiredStates(RmspropHyper{.momentum = 0.5, .centered = true}), 0b111u);

  EXPECT_EQ(RequiredStates(AdagradHyper{}), 0b001u);
  EXPECT_EQ(RequiredStates(AdagradHyper{.initial_accumulator_value = 0.1}), 0b001u);

  // Lion: exp_avg only; LAMB: exp_avg and exp_avg_sq, whatever the options.
  EXPECT_EQ(RequiredStates(LionHyper{}), 0b001u);
  EXPECT_EQ(RequiredStates(LionHyper{.weight_decay = 0.1, .maximize = true}), 0b001u);
  EXPECT_EQ(RequiredStates(LambHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(LambHyper{.weight_decay = 0.0}), 0b011u);
  EXPECT_EQ(RequiredStates(LambHyper{.bias_correction = false,
                                     .adam_w_mode = false,
                                     .grad_averaging = false,
                                     .use_nvlamb = true}),
            0b011u);

  // Adamax: exp_avg and exp_inf, whatever the options.
  EXPECT_EQ(RequiredStates(AdamaxHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(AdamaxHyper{.weight_decay = 0.1, .maximize = true}), 0b011u);
  // Adadelta: square_avg and acc_delta, whatever the options.
  EXPECT_EQ(RequiredStates(AdadeltaHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(AdadeltaHyper{.weight_decay = 0.1, .maximize = true}), 0b011u);
  // RAdam: exp_avg and exp_avg_sq, whatever the options.
  EXPECT_EQ(RequiredStates(RadamHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(NadamHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(NadamHyper{.weight_decay = 0.1, .decoupled_weight_decay = true}),
            0b011u);
  EXPECT_EQ(RequiredStates(RadamHyper{.weight_decay = 0.1, .decoupled_weight_decay = true}),
            0b011u);
  // RMSpropTF: square_avg, momentum_buffer with momentum > 0, grad_avg when centered.
  EXPECT_EQ(RequiredStates(RmsproptfHyper{}), 0b001u);
  EXPECT_EQ(RequiredStates(RmsproptfHyper{.weight_decay = 0.1, .decoupled_decay = true}), 0b001u);
  EXPECT_EQ(RequiredStates(RmsproptfHyper{.momentum = 0.9}), 0b011u);
  EXPECT_EQ(RequiredStates(RmsproptfHyper{.momentum = 0.9, .lr_in_momentum = false}), 0b011u);
  EXPECT_EQ(RequiredStates(RmsproptfHyper{.centered = true}), 0b101u);
  EXPECT_EQ(RequiredStates(RmsproptfHyper{.momentum = 0.9, .centered = true}), 0b111u);
  // ASGD: ax, whatever the options (a copy of the param until averaging starts).
  EXPECT_EQ(RequiredStates(AsgdHyper{}), 0b001u);
  EXPECT_EQ(RequiredStates(AsgdHyper{.t0 = 0.0, .weight_decay = 0.1, .maximize = true}), 0b001u);
  // LARS: momentum_buffer only with momentum, as SGD.
  EXPECT_EQ(RequiredStates(LarsHyper{}), 0b000u);
  EXPECT_EQ(RequiredStates(LarsHyper{.weight_decay = 0.1, .clip = false}), 0b000u);
  EXPECT_EQ(RequiredStates(LarsHyper{.momentum = 0.9}), 0b001u);
  // Rprop: prev and step_size, whatever the options.
  EXPECT_EQ(RequiredStates(RpropHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(RpropHyper{.maximize = true}), 0b011u);
  // AdamP: exp_avg and exp_avg_sq, whatever the options.
  EXPECT_EQ(RequiredStates(AdampHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(AdampHyper{.weight_decay = 0.1, .nesterov = true}), 0b011u);
  EXPECT_EQ(RequiredStates(BertAdamHyper{}), 0b011u);
  EXPECT_EQ(RequiredStates(BertAdamHyper{.weight_decay = 0.0, .max_grad_norm = -1.0}), 0b011u);
  EXPECT_EQ(RequiredStates(AdafactorHyper{}), 0b111u);  // by shape: see AdafactorSegments
}

// Adamax: torch.optim.Adamax's constructor checks (lr, eps, weight_decay >= 0; betas in [0, 1)).
TEST(Validation, AdamaxRejectsBadHyperParameters) {
  ExpectBadGroup(AdamaxHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdamaxHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdamaxHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(AdamaxHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"});
  ExpectBadGroup(AdamaxHyper{.beta1 = -0.1}, {"beta1", "-0.1"});
  ExpectBadGroup(AdamaxHyper{.beta2 = 1.0}, {"beta2: 1"});
  ExpectBadGroup(AdamaxHyper{.beta2 = kNaN}, {"beta2", "nan"});
  ExpectBadGroup(AdamaxHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(AdamaxHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
}

// The edges torch accepts: lr, eps and both betas 0.
TEST(Validation, AdamaxAcceptsTheEdges) {
  const AdamaxHyper h{.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .eps = 0.0};
  Model m = MakeModel(h, h);
  const std::vector<AdamaxHyper> groups = {h, h};
  EXPECT_NO_THROW(AdamaxStep(groups, m.segments()));
}

// Adadelta: torch.optim.Adadelta's constructor checks (lr, eps, weight_decay >= 0; rho in [0, 1]).
TEST(Validation, AdadeltaRejectsBadHyperParameters) {
  ExpectBadGroup(AdadeltaHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AdadeltaHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AdadeltaHyper{.rho = 1.5}, {"rho", "1.5", "[0, 1]"});
  ExpectBadGroup(AdadeltaHyper{.rho = -0.1}, {"rho", "-0.1"});
  ExpectBadGroup(AdadeltaHyper{.rho = kNaN}, {"rho", "nan"});
  ExpectBadGroup(AdadeltaHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(AdadeltaHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
}

// The edges torch accepts: lr 0, rho 0 and 1, eps 0.
TEST(Validation, AdadeltaAcceptsTheEdges) {
  for (const AdadeltaHyper& h :
       {AdadeltaHyper{.lr = 0.0, .rho = 0.0, .eps = 0.0}, AdadeltaHyper{.rho = 1.0}}) {
    Model m = MakeModel(h, h);
    const std::vector<AdadeltaHyper> groups = {h, h};
    EXPECT_NO_THROW(AdadeltaStep(groups, m.segments()));
  }
}

// RAdam: torch.optim.RAdam's constructor checks (as Adamax's).
TEST(Validation, NadamRejectsBadHyperParameters) {
  ExpectBadGroup(NadamHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(NadamHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(NadamHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(NadamHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"});
  ExpectBadGroup(NadamHyper{.beta2 = 1.0}, {"beta2: 1"});
  ExpectBadGroup(NadamHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(NadamHyper{.momentum_decay = -0.004}, {"momentum_decay", "-0.004"});
  ExpectBadGroup(NadamHyper{.momentum_decay = kNaN}, {"momentum_decay", "nan"});
}

// ASGD: torch.optim.ASGD's constructor checks (lr and weight_decay >= 0); lambd, alpha and t0 have
// none.
TEST(Validation, AsgdRejectsBadHyperParameters) {
  ExpectBadGroup(AsgdHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(AsgdHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(AsgdHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(AsgdHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
}

TEST(Validation, AsgdAcceptsWhatTorchAccepts) {
  for (const AsgdHyper& h : {AsgdHyper{.lr = 0.0, .lambd = 0.0, .alpha = 0.0, .t0 = -3.0},
                             AsgdHyper{.lambd = -1e-3, .alpha = 2.0, .t0 = 0.5}}) {
    Model m = MakeModel(h, h);
    const std::vector<AsgdHyper> groups = {h, h};
    EXPECT_NO_THROW(AsgdStep(groups, m.segments()));
  }
}

// Rprop: torch.optim.Rprop's constructor checks (lr >= 0, 0 < etaminus < 1 < etaplus); the step
// sizes have none.
TEST(Validation, RpropRejectsBadHyperParameters) {
  ExpectBadGroup(RpropHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(RpropHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(RpropHyper{.etaminus = 0.0}, {"eta values: 0, 1.2"});
  ExpectBadGroup(RpropHyper{.etaminus = 1.0}, {"eta values: 1, 1.2"});
  ExpectBadGroup(RpropHyper{.etaminus = kNaN}, {"eta values: nan"});
  ExpectBadGroup(RpropHyper{.etaplus = 1.0}, {"eta values: 0.5, 1"});
  ExpectBadGroup(RpropHyper{.etaplus = kNaN}, {"eta values: 0.5, nan"});
}

TEST(Validation, RpropAcceptsWhatTorchAccepts) {
  for (const RpropHyper& h :
       {RpropHyper{.lr = 0.0, .etaminus = 1e-50, .etaplus = 1e300},
        RpropHyper{.step_size_min = 1.0, .step_size_max = 0.5},  // min > max: every step is max
        RpropHyper{.step_size_min = -1.0, .step_size_max = kNaN}}) {
    Model m = MakeModel(h, h);
    const std::vector<RpropHyper> groups = {h, h};
    EXPECT_NO_THROW(RpropStep(groups, m.segments()));
  }
}

TEST(Validation, RadamRejectsBadHyperParameters) {
  ExpectBadGroup(RadamHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(RadamHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(RadamHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(RadamHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"});
  ExpectBadGroup(RadamHyper{.beta2 = 1.0}, {"beta2: 1"});
  ExpectBadGroup(RadamHyper{.beta2 = -0.5}, {"beta2", "-0.5"});
  ExpectBadGroup(RadamHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
}

// RMSpropTF: NpuFusedRMSpropTF's constructor checks (lr, eps, momentum, weight_decay, alpha each
// >= 0; alpha has no upper bound).
TEST(Validation, RmsproptfRejectsBadHyperParameters) {
  ExpectBadGroup(RmsproptfHyper{.lr = -0.5}, {"lr", "-0.5"});
  ExpectBadGroup(RmsproptfHyper{.lr = kNaN}, {"lr", "nan"});
  ExpectBadGroup(RmsproptfHyper{.eps = -0.25}, {"eps", "-0.25"});
  ExpectBadGroup(RmsproptfHyper{.momentum = -0.9}, {"momentum", "-0.9"});
  ExpectBadGroup(RmsproptfHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"});
  ExpectBadGroup(RmsproptfHyper{.weight_decay = kNaN}, {"weight_decay", "nan"});
  ExpectBadGroup(RmsproptfHyper{.alpha = -0.1}, {"alpha", "-0.1"});
  ExpectBadGroup(RmsproptfHyper{.alpha = kNaN}, {"alpha", "nan"});
}

TEST(Validation, RmsproptfAcceptsTheEdges) {
  const RmsproptfHyper h{.lr = 0.0, .alpha = 0.0, .eps = 0.0, .momentum = 0.0};
  const RmsproptfHyper big_alpha{.alpha = 1.5, .weight_decay = 0.0};
  Model m = MakeModel(h, big_alpha);
  const std::vector<RmsproptfHyper> groups = {h, big_alpha};
  EXPECT_NO_THROW(RmsproptfStep(groups, m.segments()));
}

// A call without segments still checks its groups: the Python drop-in checks the hyper-parameters
// this way before torch's step runs on some params, and before it counts a micro-batch.
TEST(Validation, TrainingStepWithoutSegmentsChecksTheGroups) {
  Runtime runtime(1);
  const std::vector<AdamHyper> bad = {AdamHyper{}, AdamHyper{.lr = -1.0}};
  try {
    TrainingStep(std::span<const AdamHyper>(bad), std::span<Segment>(), {}, runtime);
    ADD_FAILURE() << "an empty step with lr = -1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 1: invalid lr: -1"), std::string::npos) << e.what();
  }
  const std::vector<AdamHyper> good = {AdamHyper{}};
  EXPECT_TRUE(
      TrainingStep(std::span<const AdamHyper>(good), std::span<Segment>(), {}, runtime).stepped);
}

}  // namespace
}  // namespace fusedopt
