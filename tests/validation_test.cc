// Argument checks of the public API (step.h, runtime.h, convert.h): every rejected call throws
// fusedopt::Error naming the offending field and value, and leaves every buffer it was given
// bit-identical, including those of the valid segments listed before the bad one.

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/convert.h"
#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"
#include "tests/hyper_types.h"
#include "tests/reference/reference.h"

namespace fusedopt {
namespace {

static_assert(std::is_base_of_v<std::invalid_argument, Error>);

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
    for (float*& scalar : s.scalars)
      scalar = NewBuffer(1);  // per-tensor scalar states, where the algorithm has them
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

// The step function of each hyper-parameter struct (Stem##Step) and its name, from the public
// list, so tests can be written once for all algorithms.
#define FOPT_RAW_STEP(Stem, Alias)                                                            \
  [[maybe_unused]] void RawStep(std::span<const Stem##Hyper> g, std::span<const Segment> s) { \
    Stem##Step(g, s);                                                                         \
  }                                                                                           \
  [[maybe_unused]] constexpr const char* StepName(std::type_identity<Stem##Hyper> /*tag*/) {  \
    return #Stem "Step";                                                                      \
  }
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_RAW_STEP)
#undef FOPT_RAW_STEP

template <class Hyper>
const char* StepName() {
  return StepName(std::type_identity<Hyper>{});
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
void ExpectBadGroup(const Hyper& bad, const std::vector<const char*>& needles) {
  SCOPED_TRACE(StepName<Hyper>());
  const std::vector<Hyper> groups = {Hyper{}, bad};
  Model m =
      MakeModel(groups[0], groups[0]);  // slots of a valid group: the hyper check must come first
  std::vector<std::string> all(needles.begin(), needles.end());
  all.emplace_back(StepName<Hyper>());
  all.emplace_back("group 1");
  ExpectRejected(
      m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); }, all);
}

// ---------------------------------------------------------------------------------------------------------
// Every algorithm of the registry (src/algos/registry.h), each with the cases of its file
// tests/reference/<algo>.h (namespace ref::validation). A case an algorithm's file lacks is a
// compile error here (no overload for its Hyper), so that a new algorithm is never skipped
// silently; the optional cases (per-tensor scalar states, channel rows, factored shapes) are
// required exactly where the descriptor declares those (the Checked* functions below).

// Test names show the step function (ValidationOf/<Stem>Step.MissingState).
struct StepNames {
  template <class Hyper>
  static std::string GetName(int /*index*/) {
    return StepName<Hyper>();
  }
};
template <class Hyper>
class ValidationOf : public ::testing::Test {};
TYPED_TEST_SUITE(ValidationOf, test::HyperTypes<algos::All>, StepNames);

template <class Hyper>
constexpr std::type_identity<Hyper> kTag{};

// The valid form of each test model really is updated, so Unchanged() above means something.
TYPED_TEST(ValidationOf, ValidCallChangesBuffers) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  const auto before = m.Snapshot();
  const std::vector<Hyper> groups(2);
  RawStep(std::span<const Hyper>(groups), m.segments());
  EXPECT_FALSE(m.Unchanged(before));
}

TYPED_TEST(ValidationOf, ErrorIsInvalidArgument) {
  using Hyper = TypeParam;
  const auto cases = ref::validation::RejectedHypers(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  Model m = MakeModel(Hyper{}, Hyper{});
  const std::vector<Hyper> groups = {Hyper{}, cases.front().first};
  EXPECT_THROW(RawStep(std::span<const Hyper>(groups), m.segments()), std::invalid_argument);
}

// Each invalid group (the rules the algorithm's reference checks, and what it cannot run) is
// rejected with a message naming the field and the value.
TYPED_TEST(ValidationOf, RejectsBadHyperParameters) {
  const auto cases = ref::validation::RejectedHypers(kTag<TypeParam>);
  ASSERT_FALSE(cases.empty());
  for (const auto& [bad, needles] : cases) ExpectBadGroup(bad, needles);
}

// The edges the reference accepts (lr 0, which a schedule may reach, among them) are accepted.
TYPED_TEST(ValidationOf, AcceptsTheEdges) {
  using Hyper = TypeParam;
  const std::vector<Hyper> cases = ref::validation::AcceptedHypers(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  for (const Hyper& h : cases) {
    Model m = MakeModel(h, h);
    const std::vector<Hyper> groups = {h, h};
    EXPECT_NO_THROW(RawStep(std::span<const Hyper>(groups), m.segments()));
  }
}

TYPED_TEST(ValidationOf, RequiredStates) {
  const auto cases = ref::validation::RequiredStatesCases(kTag<TypeParam>);
  ASSERT_FALSE(cases.empty());
  for (const auto& [h, slots] : cases) EXPECT_EQ(RequiredStates(h), slots);
}

// A group's slots that RequiredStates leaves out may be null.
TYPED_TEST(ValidationOf, StatesNotRequiredMayBeNull) {
  using Hyper = TypeParam;
  for (const auto& [h, slots] : ref::validation::RequiredStatesCases(kTag<Hyper>)) {
    Model m;
    m.Add(1000, 0, slots);
    m.Add(64, 1, slots);
    const std::vector<Hyper> groups = {h, h};
    EXPECT_NO_THROW(RawStep(std::span<const Hyper>(groups), m.segments())) << slots;
  }
}

// The descriptor names each state slot with torch's state_dict key (the checkpoints and the
// messages below use them).
TYPED_TEST(ValidationOf, StateKeysAreTorchs) {
  const std::vector<const char*> keys = ref::validation::StateKeys(kTag<TypeParam>);
  ASSERT_EQ(keys.size(), std::size_t{kMaxStates});
  for (int k = 0; k < kMaxStates; ++k) {
    EXPECT_STREQ(algos::DescriptorOf<TypeParam>::kStates[k], keys[k]) << "slot " << k;
  }
}

// Segment 2 lacks state[slot], which `h` requires.
template <class Hyper>
void ExpectMissingState(const Hyper& h, int slot, const std::string& key) {
  SCOPED_TRACE(StepName<Hyper>());
  ASSERT_NE(RequiredStates(h) >> slot & 1u, 0u);
  Model m = MakeModel(h, h);
  m.segment(2).state[slot] = nullptr;
  const std::vector<Hyper> groups = {h, h};
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {key, "segment 2", "state[" + std::to_string(slot) + "]"});
}

TYPED_TEST(ValidationOf, MissingState) {
  using Hyper = TypeParam;
  const std::vector<const char*> keys = ref::validation::StateKeys(kTag<Hyper>);
  const auto cases = ref::validation::MissingStates(kTag<Hyper>);
  ASSERT_FALSE(cases.empty());
  for (const auto& [h, slot] : cases) ExpectMissingState(h, slot, keys.at(slot));
}

// A segment with numel 0 may have null param, grad and states; the others are still updated.
TYPED_TEST(ValidationOf, NullBuffersAreFineWithNumelZero) {
  using Hyper = TypeParam;
  const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
  Model m = MakeModel(h, h);
  Segment& empty = m.Add(0, 1, 0);
  empty.param = nullptr;
  empty.grad = nullptr;
  const auto before = m.Snapshot();
  const std::vector<Hyper> groups = {h, h};
  EXPECT_NO_THROW(RawStep(std::span<const Hyper>(groups), m.segments()));
  EXPECT_FALSE(m.Unchanged(before));
}

TYPED_TEST(ValidationOf, SegmentsWithNoGroups) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(), m.segments()); },
                 {StepName<Hyper>(), "no groups", "3 segments"});
}

TYPED_TEST(ValidationOf, NothingToDoIsAccepted) {
  using Hyper = TypeParam;
  EXPECT_NO_THROW(RawStep(std::span<const Hyper>(), {}));
  const std::vector<Hyper> groups(1);
  EXPECT_NO_THROW(RawStep(std::span<const Hyper>(groups), {}));
}

TYPED_TEST(ValidationOf, SegmentGroupOutOfRange) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  m.segment(2).group = 5;
  const std::vector<Hyper> groups(2);
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {StepName<Hyper>(), "segment 2", "group 5", "2 groups"});
}

TYPED_TEST(ValidationOf, SegmentGroupEqualToGroupCount) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  const std::vector<Hyper> groups(1);  // segment 2 is in group 1
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "group 1", "1 groups"});
}

TYPED_TEST(ValidationOf, NullParam) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  m.segment(2).param = nullptr;
  const std::vector<Hyper> groups(2);
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "param", "null", "64"});
}

TYPED_TEST(ValidationOf, NullGrad) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  m.segment(2).grad = nullptr;
  const std::vector<Hyper> groups(2);
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "grad", "null", "64"});
}

TYPED_TEST(ValidationOf, MasterCopyWithF32Param) {
  using Hyper = TypeParam;
  Model m = MakeModel(Hyper{}, Hyper{});
  m.segment(2).master = m.NewBuffer(64);
  const std::vector<Hyper> groups(2);
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "master", "f32"});
}

// Steps count from 1, with every state in use (a momentum buffer too, where the algorithm has one).
TYPED_TEST(ValidationOf, StepZero) {
  using Hyper = TypeParam;
  const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
  Model m = MakeModel(h, h);
  m.segment(2).step = 0;
  const std::vector<Hyper> groups = {h, h};
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "step: 0"});
}

TYPED_TEST(ValidationOf, NegativeStep) {
  using Hyper = TypeParam;
  const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
  Model m = MakeModel(h, h);
  m.segment(2).step = -3;
  const std::vector<Hyper> groups = {h, h};
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "step", "-3"});
}

TYPED_TEST(ValidationOf, NegativeRoundingStep) {
  using Hyper = TypeParam;
  const Hyper h = ref::validation::AllStatesHyper(kTag<Hyper>);
  Model m = MakeModel(h, h);
  m.segment(2).rounding_step = -4;
  const std::vector<Hyper> groups = {h, h};
  ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                 {"segment 2", "rounding_step", "-4"});
}

TYPED_TEST(ValidationOf, InvalidDTypeCode) {
  using Hyper = TypeParam;
  const auto bad = static_cast<DType>(7);
  for (int field = 0; field < 3; ++field) {
    SCOPED_TRACE(field);
    Model m = MakeModel(Hyper{}, Hyper{});
    Segment& s = m.segment(2);
    (field == 0 ? s.param_dtype : field == 1 ? s.grad_dtype : s.state_dtype) = bad;
    const std::vector<Hyper> groups(2);
    ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                   {"segment 2", "dtype", "7"});
  }
}

// A call without segments still checks its groups: the Python drop-in checks the hyper-parameters
// this way before torch's step runs on some params, and before it counts a micro-batch.
TYPED_TEST(ValidationOf, TrainingStepWithoutSegmentsChecksTheGroups) {
  using Hyper = TypeParam;
  Runtime runtime(1);
  std::vector<Hyper> bad(2);
  bad[1].lr = -1.0;
  try {
    TrainingStep(std::span<const Hyper>(bad), std::span<Segment>(), {}, runtime);
    ADD_FAILURE() << "an empty step with lr = -1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 1: invalid lr: -1"), std::string::npos) << e.what();
  }
  const std::vector<Hyper> good(1);
  EXPECT_TRUE(
      TrainingStep(std::span<const Hyper>(good), std::span<Segment>(), {}, runtime).stepped);
}

// ---------------------------------------------------------------------------------------------------------
// Per-tensor scalar states (Segment::scalars: torch's 0-d state tensors).

// Whether the algorithm's case file names per-tensor scalar states (ScalarStateKeys).
template <class Hyper>
concept HasScalarCases = requires {
  ref::validation::ScalarStateKeys(kTag<Hyper>);
};

// The same, required to agree with the descriptor: an algorithm with scalar states needs their
// cases, one without must not have any.
template <class Hyper>
constexpr bool CheckedHasScalarCases() {
  static_assert(HasScalarCases<Hyper> == algos::HasScalarStates<algos::DescriptorOf<Hyper>>,
                "the per-tensor scalar states of the descriptor and of the case file "
                "(tests/reference/<algo>.h: ScalarStateKeys) differ");
  return HasScalarCases<Hyper>;
}

// Each scalar state is required for every segment, an empty one too; an algorithm without scalar
// states ignores them.
TYPED_TEST(ValidationOf, MissingScalarState) {
  using Hyper = TypeParam;
  const std::vector<Hyper> groups(2);
  if constexpr (CheckedHasScalarCases<Hyper>()) {
    const std::vector<const char*> keys = ref::validation::ScalarStateKeys(kTag<Hyper>);
    EXPECT_EQ(keys.size(), algos::NumScalarStates<algos::DescriptorOf<Hyper>>());
    for (std::size_t k = 0; k < keys.size(); ++k) {
      for (const std::size_t numel : {std::size_t{64}, std::size_t{0}}) {
        Model m = MakeModel(groups[0], groups[1]);
        Segment& last = m.Add(numel, 1, RequiredStates(groups[1]));
        last.scalars[k] = nullptr;
        ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                       {StepName<Hyper>(), "segment 3", "scalars[" + std::to_string(k) + "]",
                        keys[k], "null"});
      }
    }
  } else {
    Model m = MakeModel(groups[0], groups[1]);
    for (float*& scalar : m.segment(2).scalars) scalar = nullptr;
    EXPECT_NO_THROW(RawStep(std::span<const Hyper>(groups), m.segments()));
  }
}

// A step writes the scalar states back only once its update ran: a skipped (Inf or NaN gradient)
// or rejected call leaves them as they were, a taken one (in two waves, or the plain step) leaves
// what the reference's step t leaves (the case file's ScalarsAfter). An algorithm without scalar
// states never writes them.
TYPED_TEST(ValidationOf, ScalarStatesAdvanceOnlyWithTheUpdate) {
  using Hyper = TypeParam;
  if constexpr (CheckedHasScalarCases<Hyper>()) {
    const std::size_t n = ref::validation::ScalarStateKeys(kTag<Hyper>).size();
    const std::vector<Hyper> cases = ref::validation::ScalarStateHypers(kTag<Hyper>);
    ASSERT_FALSE(cases.empty());
    for (const Hyper& h : cases) {
      const std::vector<Hyper> groups = {h, h};
      Model m = MakeModel(h, h);
      for (std::size_t i = 0; i < 3; ++i) m.segment(i).step = static_cast<std::int64_t>(i) + 4;
      const auto scalars_of = [&](std::size_t i) {
        std::vector<float> v;
        for (std::size_t k = 0; k < n; ++k) v.push_back(*m.segment(i).scalars[k]);
        return v;
      };
      std::vector<std::vector<float>> old;
      for (std::size_t i = 0; i < 3; ++i) old.push_back(scalars_of(i));
      std::vector<Segment> segs(m.segments().begin(), m.segments().end());
      Runtime runtime(2);
      // Skipped: one gradient holds Inf, then another NaN.
      for (const auto& [seg, value] : {std::pair{1, std::numeric_limits<float>::infinity()},
                                       std::pair{0, std::numeric_limits<float>::quiet_NaN()}}) {
        auto* grad = const_cast<float*>(static_cast<const float*>(segs[seg].grad));
        const float saved = *grad;
        *grad = value;
        const auto before = m.Snapshot();
        EXPECT_FALSE(TrainingStep(std::span<const Hyper>(groups), std::span<Segment>(segs),
                                  {.check_overflow = true}, runtime)
                         .stepped);
        EXPECT_TRUE(m.Unchanged(before));
        *grad = saved;
      }
      // Rejected: an invalid group 1.
      for (const auto& [bad_group, needles] : ref::validation::RejectedHypers(kTag<Hyper>)) {
        const std::vector<Hyper> bad = {h, bad_group};
        std::vector<std::string> all(needles.begin(), needles.end());
        all.emplace_back(StepName<Hyper>());
        ExpectRejected(
            m, [&] { RawStep(std::span<const Hyper>(bad), m.segments()); }, all);
      }
      // Taken: in two waves.
      const std::array<std::size_t, 2> waves = {1, 3};
      EXPECT_TRUE(TrainingStep(std::span<const Hyper>(groups), std::span<Segment>(segs),
                               {.check_overflow = true, .wave_ends = waves}, runtime)
                      .stepped);
      for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(scalars_of(i), ref::validation::ScalarsAfter(h, m.segment(i).step, old[i]))
            << "segment " << i;
        old[i] = scalars_of(i);
      }
      // Taken: the plain step, the next one.
      for (std::size_t i = 0; i < 3; ++i) ++m.segment(i).step;
      RawStep(std::span<const Hyper>(groups), m.segments());
      for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(scalars_of(i), ref::validation::ScalarsAfter(h, m.segment(i).step, old[i]))
            << "segment " << i << ", plain step";
      }
    }
  } else {
    Model m = MakeModel(Hyper{}, Hyper{});
    std::vector<float> before;
    for (const Segment& s : m.segments()) {
      for (const float* scalar : s.scalars) before.push_back(*scalar);
    }
    const std::vector<Hyper> groups(2);
    RawStep(std::span<const Hyper>(groups), m.segments());
    std::vector<float> after;
    for (const Segment& s : m.segments()) {
      for (const float* scalar : s.scalars) after.push_back(*scalar);
    }
    EXPECT_EQ(after, before);
  }
}

// The required slots come from each segment's own group: for each two cases of RequiredStates where
// the second needs a slot the first does not, segment 2 in the second's group must have it, and in
// the first's need not.
TEST(Validation, MissingStateIsCheckedAgainstTheSegmentsGroup) {
  int checked = 0;
  algos::All::ForEach([&]<class A>(std::type_identity<A> /*tag*/) {
    using Hyper = typename A::Hyper;
    const std::vector<const char*> keys = ref::validation::StateKeys(kTag<Hyper>);
    const auto cases = ref::validation::RequiredStatesCases(kTag<Hyper>);
    for (const auto& [a, a_slots] : cases) {
      for (const auto& [b, b_slots] : cases) {
        for (int slot = 0; slot < kMaxStates; ++slot) {
          if ((b_slots & ~a_slots) >> slot & 1u) {
            SCOPED_TRACE(StepName<Hyper>() + std::string(" slot ") + std::to_string(slot));
            ++checked;
            const std::vector<Hyper> groups = {a, b};
            Model m = MakeModel(a, b);
            m.segment(2).state[slot] = nullptr;
            ExpectRejected(m, [&] { RawStep(std::span<const Hyper>(groups), m.segments()); },
                           {"segment 2", keys.at(slot)});
            const std::vector<Hyper> swapped = {b, a};
            Model fine = MakeModel(b, a);
            ASSERT_EQ(fine.segment(2).state[slot], nullptr);
            EXPECT_NO_THROW(RawStep(std::span<const Hyper>(swapped), fine.segments()));
          }
        }
      }
    }
  });
  EXPECT_GE(checked, 2);
}

// Whether the algorithm's case file says its params have channel rows (ChannelRowsOf64) or are
// factored (FactoredSlots); each required to agree with the descriptor, as the scalar states.
template <class Hyper>
concept HasChannelRowCases = requires {
  ref::validation::ChannelRowsOf64(kTag<Hyper>);
};
template <class Hyper>
concept HasFactoredCases = requires {
  ref::validation::FactoredSlots(kTag<Hyper>);
};
template <class Hyper>
constexpr bool CheckedHasChannelRowCases() {
  static_assert(HasChannelRowCases<Hyper> == algos::RowReductions<algos::DescriptorOf<Hyper>>,
                "channel rows of the descriptor and of the case file (ChannelRowsOf64) differ");
  return HasChannelRowCases<Hyper>;
}
template <class Hyper>
constexpr bool CheckedHasFactoredCases() {
  static_assert(HasFactoredCases<Hyper> == algos::Factored<algos::DescriptorOf<Hyper>>,
                "factoring of the descriptor and of the case file (FactoredSlots) differ");
  return HasFactoredCases<Hyper>;
}

// Segment::rows and cols: channel rows must divide numel (0, a 1-D param, and numel itself are
// fine); a factored segment has rows and cols both set (and dividing numel) or both 0, numel > 0,
// with stochastic rounding a valid global_offset, the row and column factors for matrices and the
// variance for vectors (the other slots may be null); every other algorithm ignores rows. Each
// rejection leaves every buffer as it was.
TYPED_TEST(ValidationOf, SegmentShape) {
  using Hyper = TypeParam;
  std::vector<Hyper> groups(2);
  groups[1].lr = 0.1;
  const auto step = [&](const Model& m) { RawStep(std::span<const Hyper>(groups), m.segments()); };
  if constexpr (CheckedHasChannelRowCases<Hyper>()) {
    Model m = MakeModel(groups[0], groups[1]);
    m.segment(2).rows = 3;  // 64 elements
    ExpectRejected(m, [&] { step(m); }, {StepName<Hyper>(), "segment 2", "rows 3", "numel 64"});
    const std::vector<std::size_t> fine = ref::validation::ChannelRowsOf64(kTag<Hyper>);
    ASSERT_FALSE(fine.empty());
    for (const std::size_t rows : fine) {
      m.segment(2).rows = rows;
      EXPECT_NO_THROW(step(m)) << rows;
    }
  } else if constexpr (CheckedHasFactoredCases<Hyper>()) {
    const std::vector<const char*> keys = ref::validation::StateKeys(kTag<Hyper>);
    const std::vector<int> slots = ref::validation::FactoredSlots(kTag<Hyper>);
    ASSERT_EQ(slots.size(), 3u);
    const int row_var = slots[0], col_var = slots[1], variance = slots[2];
    const auto state = [&](int slot) { return "state[" + std::to_string(slot) + "]"; };
    {
      Model m = MakeModel(groups[0], groups[1]);
      m.segment(2).rows = 4;  // 64 elements, cols 0
      ExpectRejected(m, [&] { step(m); }, {StepName<Hyper>(), "segment 2", "rows 4", "cols 0"});
      m.segment(2).rows = 0;
      m.segment(2).cols = 4;
      ExpectRejected(m, [&] { step(m); }, {"segment 2", "rows 0", "cols 4"});
      m.segment(2).rows = 3;
      ExpectRejected(m, [&] { step(m); }, {"segment 2", "rows 3", "cols 4", "numel 64"});
      m.segment(2).rows = 2;
      m.segment(2).cols = 8;  // a batch of 4 matrices of 2 x 8
      EXPECT_NO_THROW(step(m));
      m.segment(2).state[variance] = nullptr;  // a matrix needs no variance
      EXPECT_NO_THROW(step(m));
      m.segment(2).state[col_var] = nullptr;
      ExpectRejected(m, [&] { step(m); }, {"segment 2", state(col_var), keys.at(col_var)});
    }
    {
      Model m = MakeModel(groups[0], groups[1]);
      m.segment(1).state[row_var] = nullptr;  // a vector needs only variance
      m.segment(1).state[col_var] = nullptr;
      EXPECT_NO_THROW(step(m));
      m.segment(1).state[variance] = nullptr;
      ExpectRejected(m, [&] { step(m); }, {"segment 1", state(variance), keys.at(variance)});
    }
    {  // numel 0 (TrainingStep's up-front check): nothing is read or written, null buffers are fine
      Model m = MakeModel(groups[0], groups[1]);
      Segment& empty = m.segment(0);
      empty.numel = 0;
      empty.rows = 2;
      empty.cols = 3;
      empty.param = nullptr;
      empty.grad = nullptr;
      for (void*& s : empty.state) s = nullptr;
      const auto before = m.Snapshot();
      m.segment(1).numel = 0;
      m.segment(2).numel = 0;
      EXPECT_NO_THROW(step(m));
      EXPECT_TRUE(m.Unchanged(before));
    }
    {
      Model m = MakeModel(groups[0], groups[1]);
      // Stochastic rounding is checked as for every algorithm: room for the segment's indices
      // after global_offset (its factors' indices are fewer).
      m.segment(2).stochastic_rounding = true;
      m.segment(2).global_offset = std::numeric_limits<std::uint64_t>::max() - 10;
      ExpectRejected(m, [&] { step(m); }, {StepName<Hyper>(), "segment 2", "global_offset"});
      m.segment(2).global_offset = 0;
      EXPECT_NO_THROW(step(m));
    }
  } else {
    Model m = MakeModel(groups[0], groups[1]);
    m.segment(2).rows = 3;
    EXPECT_NO_THROW(step(m));
  }
}

// ---------------------------------------------------------------------------------------------------------
// The rest of the public API.

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

}  // namespace
}  // namespace fusedopt
