// LR schedules (include/fusedopt/schedule.h) against torch.optim.lr_scheduler. The golden files
// tests/golden/schedules/*.json (tools/make_schedule_golden.py) hold the lr (and momentum / beta1)
// that torch's schedulers set on two param groups at step 0 and after every sched.step(); each of
// those values must match our closed form at the same step.
//
// Tolerance: |ours - torch| <= 1e-12 * |torch| + 1e-14 * max|torch| over the sequence. torch
// updates the lr recursively (lr_t = lr_{t-1} * ratio_t, chainable form) while we evaluate the
// closed form; the two differ only by accumulated rounding, a few ulps per step (observed: below
// 1e-13 relative over 120 steps). The absolute floor covers values that the closed form makes
// exactly 0 while torch's recursion leaves a rounding residue (LinearLR with end_factor = 0 ends
// at ~1e-18 instead of 0). OneCycleLR is not recursive in torch either; it matches bit for bit
// here, but is held to the same tolerance so a different libm cos cannot fail it.

#include "fusedopt/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusedopt/error.h"

namespace fusedopt {
namespace {

using nlohmann::json;

constexpr double kRtol = 1e-12;
constexpr double kAtolFactor = 1e-14;  // times max|value| of the sequence

json LoadGolden(const std::string& name) {
  const std::string path = std::string(FOPT_GOLDEN_DIR) + "/schedules/" + name + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

// A keyword argument of a spec, or torch's default for it.
struct Kwargs {
  const json& given;
  const json& defaults;
  const json& operator[](const char* key) const {
    return given.contains(key) ? given.at(key) : defaults.at(key);
  }
  double D(const char* key) const { return (*this)[key].get<double>(); }
  std::int64_t I(const char* key) const { return (*this)[key].get<std::int64_t>(); }
  bool B(const char* key) const { return (*this)[key].get<bool>(); }
};

// The fusedopt schedule for a golden spec, for param group `group` whose lr is `base_lr`.
Schedule Build(const json& spec, std::size_t group, double base_lr, const json& torch_defaults) {
  const std::string type = spec.at("type");
  if (type == "SequentialLR") {
    std::vector<Schedule> parts;
    for (const json& sub : spec.at("schedulers"))
      parts.push_back(Build(sub, group, base_lr, torch_defaults));
    return SequentialLr(parts, spec.at("milestones").get<std::vector<std::int64_t>>());
  }
  const Kwargs kw{spec.at("kwargs"), torch_defaults.at(type)};
  if (type == "ConstantLR") return ConstantLr(base_lr, kw.D("factor"), kw.I("total_iters"));
  if (type == "LinearLR") {
    return LinearLr(base_lr, kw.D("start_factor"), kw.D("end_factor"), kw.I("total_iters"));
  }
  if (type == "CosineAnnealingLR")
    return CosineAnnealingLr(base_lr, kw.I("T_max"), kw.D("eta_min"));
  if (type == "StepLR") return StepLr(base_lr, kw.I("step_size"), kw.D("gamma"));
  if (type == "MultiStepLR") {
    return MultiStepLr(base_lr, kw["milestones"].get<std::vector<std::int64_t>>(), kw.D("gamma"));
  }
  if (type == "ExponentialLR") return ExponentialLr(base_lr, kw.D("gamma"));
  if (type == "PolynomialLR") return PolynomialLr(base_lr, kw.I("total_iters"), kw.D("power"));
  if (type == "OneCycleLR") {  // ignores the group's lr: it starts from max_lr / div_factor
    const json& max_lr = kw["max_lr"];
    OneCycleOptions o;
    o.max_lr = max_lr.is_array() ? max_lr.at(group).get<double>() : max_lr.get<double>();
    o.total_steps = kw.I("total_steps");
    o.pct_start = kw.D("pct_start");
    o.anneal_cos = kw["anneal_strategy"].get<std::string>() == "cos";
    o.div_factor = kw.D("div_factor");
    o.final_div_factor = kw.D("final_div_factor");
    o.three_phase = kw.B("three_phase");
    o.cycle_momentum = kw.B("cycle_momentum");
    o.base_momentum = kw.D("base_momentum");
    o.max_momentum = kw.D("max_momentum");
    return OneCycleLr(o);
  }
  throw std::runtime_error("unknown scheduler type " + type);
}

struct Stats {
  int values = 0, identical = 0;
  double max_rel = 0.0;     // over values above the absolute floor
  double max_of_tol = 0.0;  // largest error as a fraction of its tolerance
};

// Compares fn(t) with want[t] for every t.
void ExpectSequence(const std::vector<double>& want, const std::function<double(std::int64_t)>& fn,
                    const std::string& what, Stats& stats) {
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t t = 0; t < want.size(); ++t) {
    const double got = fn(static_cast<std::int64_t>(t));
    const double err = std::abs(got - want[t]);
    const double tol = kRtol * std::abs(want[t]) + kAtolFactor * scale;
    EXPECT_LE(err, tol) << what << " at step " << t << ": got " << got << ", torch " << want[t];
    ++stats.values;
    stats.identical += got == want[t];
    stats.max_of_tol = std::max(stats.max_of_tol, err / tol);
    if (std::abs(want[t]) > kAtolFactor * scale) {
      stats.max_rel = std::max(stats.max_rel, err / std::abs(want[t]));
    }
  }
}

// Every case of tests/golden/schedules/<name>.json.
void CheckGoldenFile(const std::string& name) {
  const json doc = LoadGolden(name);
  const json& defaults = doc.at("torch_defaults");
  ASSERT_FALSE(doc.at("cases").empty());
  Stats stats;
  for (const json& c : doc.at("cases")) {
    const std::string case_name = c.at("name");
    SCOPED_TRACE(name + "/" + case_name);
    const auto base_lrs = c.at("group_lrs").get<std::vector<double>>();
    const std::int64_t steps = c.at("steps");
    for (std::size_t g = 0; g < base_lrs.size(); ++g) {
      const Schedule s = Build(c.at("spec"), g, base_lrs[g], defaults);
      const std::string what = case_name + " group " + std::to_string(g);
      const auto lrs = c.at("lr").at(g).get<std::vector<double>>();
      ASSERT_EQ(lrs.size(), static_cast<std::size_t>(steps + 1));
      ExpectSequence(lrs, s, what + " lr", stats);
      if (c.contains("momentum")) {
        ASSERT_TRUE(s.has_momentum()) << what;
        ExpectSequence(
            c.at("momentum").at(g).get<std::vector<double>>(),
            [&s](std::int64_t t) { return s.Momentum(t); },
            what + " " + c.at("momentum_key").get<std::string>(), stats);
      } else {
        EXPECT_FALSE(s.has_momentum()) << what;
        EXPECT_THROW(s.Momentum(0), Error) << what;
      }
      // Where torch refuses one more step, so do we (OneCycleLR past total_steps or a
      // zero-length phase); elsewhere the schedule goes on.
      if (c.at("next_step_raises").is_null()) {
        EXPECT_NO_THROW(s.Lr(steps + 1)) << what;
      } else {
        EXPECT_THROW(s.Lr(steps + 1), Error) << what;
      }
      EXPECT_THROW(s.Lr(-1), Error) << what;
    }
  }
  std::printf(
      "[ schedule ] %s: %d values, %d bit-identical to torch, max rel err %.3g, max err/tol %.3g\n",
      name.c_str(), stats.values, stats.identical, stats.max_rel, stats.max_of_tol);
}

TEST(Schedule, GoldenConstantLr) { CheckGoldenFile("constant_lr"); }
TEST(Schedule, GoldenLinearLr) { CheckGoldenFile("linear_lr"); }
TEST(Schedule, GoldenCosineAnnealingLr) { CheckGoldenFile("cosine_annealing_lr"); }
TEST(Schedule, GoldenStepLr) { CheckGoldenFile("step_lr"); }
TEST(Schedule, GoldenMultiStepLr) { CheckGoldenFile("multi_step_lr"); }
TEST(Schedule, GoldenExponentialLr) { CheckGoldenFile("exponential_lr"); }
TEST(Schedule, GoldenPolynomialLr) { CheckGoldenFile("polynomial_lr"); }
TEST(Schedule, GoldenSequentialLr) { CheckGoldenFile("sequential_lr"); }
TEST(Schedule, GoldenOneCycleLr) { CheckGoldenFile("one_cycle_lr"); }

// Each "lr" is bit for bit the same function of t as the other.
void ExpectSameSchedule(const Schedule& a, const Schedule& b, std::int64_t steps) {
  ASSERT_EQ(a.has_momentum(), b.has_momentum());
  for (std::int64_t t = 0; t <= steps; ++t) {
    EXPECT_EQ(a.Lr(t), b.Lr(t)) << a.Describe() << " vs " << b.Describe() << " at step " << t;
    if (a.has_momentum()) {
      EXPECT_EQ(a.Momentum(t), b.Momentum(t)) << "momentum at step " << t;
    }
  }
}

// Our default arguments are torch's (from torch's signatures, recorded by the generator).
TEST(Schedule, DefaultsAreTorchs) {
  const json d = LoadGolden("sequential_lr").at("torch_defaults");
  const json od = LoadGolden("one_cycle_lr").at("torch_defaults").at("OneCycleLR");
  const double b = 0.1;
  ExpectSameSchedule(
      ConstantLr(b),
      ConstantLr(b, d.at("ConstantLR").at("factor"), d.at("ConstantLR").at("total_iters")), 20);
  const json& lin = d.at("LinearLR");
  ExpectSameSchedule(
      LinearLr(b), LinearLr(b, lin.at("start_factor"), lin.at("end_factor"), lin.at("total_iters")),
      20);
  ExpectSameSchedule(CosineAnnealingLr(b, 10),
                     CosineAnnealingLr(b, 10, d.at("CosineAnnealingLR").at("eta_min")), 20);
  ExpectSameSchedule(StepLr(b, 3), StepLr(b, 3, d.at("StepLR").at("gamma")), 20);
  ExpectSameSchedule(MultiStepLr(b, {2, 5}),
                     MultiStepLr(b, {2, 5}, d.at("MultiStepLR").at("gamma")), 20);
  ExpectSameSchedule(
      PolynomialLr(b),
      PolynomialLr(b, d.at("PolynomialLR").at("total_iters"), d.at("PolynomialLR").at("power")),
      20);
  const OneCycleOptions o;
  EXPECT_EQ(o.pct_start, od.at("pct_start").get<double>());
  EXPECT_EQ(o.anneal_cos, od.at("anneal_strategy").get<std::string>() == "cos");
  EXPECT_EQ(o.cycle_momentum, od.at("cycle_momentum").get<bool>());
  EXPECT_EQ(o.base_momentum, od.at("base_momentum").get<double>());
  EXPECT_EQ(o.max_momentum, od.at("max_momentum").get<double>());
  EXPECT_EQ(o.div_factor, od.at("div_factor").get<double>());
  EXPECT_EQ(o.final_div_factor, od.at("final_div_factor").get<double>());
  EXPECT_EQ(o.three_phase, od.at("three_phase").get<bool>());
}

TEST(Schedule, WarmupCosineIsSequentialLinearThenCosine) {
  struct Case {
    double base_lr;
    std::int64_t warmup, total;
    double min_lr, start_factor;
  };
  for (const Case& c : {Case{0.1, 5, 30, 1e-4, 0.1}, Case{3e-4, 100, 1000, 3e-5, 1e-3},
                        Case{1.0, 1, 2, 0.0, 1.0}}) {
    const Schedule expected =
        SequentialLr({LinearLr(c.base_lr, c.start_factor, 1.0, c.warmup),
                      CosineAnnealingLr(c.base_lr, c.total - c.warmup, c.min_lr)},
                     {c.warmup});
    ExpectSameSchedule(WarmupCosine(c.base_lr, c.warmup, c.total, c.min_lr, c.start_factor),
                       expected, c.total + 10);
  }
  // Without warmup it is the cosine alone; the default start factor is LinearLR's 1/3.
  ExpectSameSchedule(WarmupCosine(0.1, 0, 50, 1e-3), CosineAnnealingLr(0.1, 50, 1e-3), 60);
  ExpectSameSchedule(
      WarmupCosine(0.1, 10, 100),
      SequentialLr({LinearLr(0.1, 1.0 / 3, 1.0, 10), CosineAnnealingLr(0.1, 90)}, {10}), 110);
}

// The torch goldens of SequentialLR(LinearLR, CosineAnnealingLR) are WarmupCosine's values.
TEST(Schedule, WarmupCosineMatchesTorchSequentialLr) {
  const json doc = LoadGolden("sequential_lr");
  Stats stats;
  for (const json& c : doc.at("cases")) {
    const std::string name = c.at("name");
    if (name != "warmup_cosine" && name != "warmup_cosine_defaults") continue;
    const auto base_lrs = c.at("group_lrs").get<std::vector<double>>();
    for (std::size_t g = 0; g < base_lrs.size(); ++g) {
      const Schedule s = name == "warmup_cosine" ? WarmupCosine(base_lrs[g], 5, 30, 1e-4, 0.1)
                                                 : WarmupCosine(base_lrs[g], 10, 100);
      ExpectSequence(c.at("lr").at(g).get<std::vector<double>>(), s, name, stats);
    }
  }
  EXPECT_EQ(stats.values, 2 * (41 + 101));
}

TEST(Schedule, SequentialComposes) {
  const Schedule a = LinearLr(0.1, 0.1, 1.0, 4), b = ExponentialLr(0.1, 0.9),
                 c = CosineAnnealingLr(0.1, 12, 1e-3);
  const Schedule flat = SequentialLr({a, b, c}, {4, 9});
  // A SequentialLr is a Schedule like any other, so it nests: ((a then b) then c).
  ExpectSameSchedule(SequentialLr({SequentialLr({a, b}, {4}), c}, {9}), flat, 40);
  // The definition, evaluated by hand: part i restarts at its own step 0 at milestones[i-1].
  for (std::int64_t t = 0; t <= 40; ++t) {
    const double want = t < 4 ? a.Lr(t) : t < 9 ? b.Lr(t - 4) : c.Lr(t - 9);
    EXPECT_EQ(flat.Lr(t), want) << "step " << t;
  }
  // Equal milestones skip a part; one schedule and no milestones is the schedule itself.
  ExpectSameSchedule(SequentialLr({a, b, c}, {4, 4}), SequentialLr({a, c}, {4}), 30);
  ExpectSameSchedule(SequentialLr({b}, {}), b, 30);
  // Copies share the implementation and evaluate identically.
  const Schedule copy = flat;  // NOLINT(performance-unnecessary-copy-initialization)
  ExpectSameSchedule(copy, flat, 20);
  EXPECT_EQ(copy.Describe(), flat.Describe());
}

TEST(Schedule, SequentialMomentumNeedsEveryPart) {
  OneCycleOptions o;
  o.max_lr = 0.1;
  o.total_steps = 20;
  const Schedule cycle = OneCycleLr(o);
  const Schedule two = SequentialLr({cycle, cycle}, {21});
  ASSERT_TRUE(two.has_momentum());
  for (std::int64_t t = 0; t <= 41; ++t) {
    EXPECT_EQ(two.Momentum(t), cycle.Momentum(t <= 20 ? t : t - 21)) << "step " << t;
  }
  EXPECT_THROW(two.Lr(42), Error);  // the second cycle is past its total_steps
  const Schedule mixed = SequentialLr({cycle, ConstantSchedule(1e-5)}, {20});
  EXPECT_FALSE(mixed.has_momentum());
  EXPECT_EQ(mixed.Lr(100), 1e-5);
}

TEST(Schedule, ConstantAndCustom) {
  const Schedule c = ConstantSchedule(0.25);
  for (std::int64_t t : {0, 1, 7, 1000000}) EXPECT_EQ(c.Lr(t), 0.25);
  EXPECT_FALSE(c.has_momentum());
  const Schedule half_life(
      "HalfLife(10)", [](std::int64_t t) { return std::ldexp(1.0, -static_cast<int>(t / 10)); },
      [](std::int64_t t) { return t < 5 ? 0.9 : 0.8; });
  EXPECT_EQ(half_life(25), 0.25);
  EXPECT_EQ(half_life.Momentum(6), 0.8);
  EXPECT_EQ(half_life.Describe(), "HalfLife(10)");
  EXPECT_THROW(half_life(-3), Error);
  EXPECT_THROW(Schedule("empty", {}), Error);
}

TEST(Schedule, Describe) {
  EXPECT_EQ(LinearLr(0.1, 0.25).Describe(),
            "LinearLr(base_lr=0.1, start_factor=0.25, end_factor=1, total_iters=5)");
  EXPECT_EQ(SequentialLr({ConstantSchedule(0.5), MultiStepLr(0.5, {3, 4})}, {2}).Describe(),
            "SequentialLr(schedules=[ConstantSchedule(lr=0.5), "
            "MultiStepLr(base_lr=0.5, milestones=[3, 4], gamma=0.1)], milestones=[2])");
}

// fn() throws fusedopt::Error whose message contains every piece.
void ExpectError(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << pieces.front();
  } catch (const Error& e) {
    for (const std::string& p : pieces) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << e.what() << "' does not mention '" << p << "'";
    }
  }
}

TEST(Schedule, InvalidArguments) {
  const double nan = std::nan("");
  ExpectError([] { ConstantSchedule(-1.0); }, {"ConstantSchedule", "lr", "-1"});
  ExpectError([&] { ConstantSchedule(nan); }, {"ConstantSchedule", "lr", "nan"});
  ExpectError([] { ConstantLr(0.1, 1.5); }, {"ConstantLr", "factor", "1.5"});
  ExpectError([] { ConstantLr(0.1, -0.1); }, {"ConstantLr", "factor", "-0.1"});
  ExpectError([] { ConstantLr(0.1, 0.5, 0); }, {"ConstantLr", "total_iters", "0"});
  // torch LinearLR: start_factor in (0, 1], end_factor in [0, 1].
  ExpectError([] { LinearLr(0.1, 0.0); }, {"LinearLr", "start_factor", "0"});
  ExpectError([] { LinearLr(0.1, 1.01); }, {"LinearLr", "start_factor", "1.01"});
  ExpectError([] { LinearLr(0.1, 0.5, 1.5); }, {"LinearLr", "end_factor", "1.5"});
  ExpectError([] { LinearLr(0.1, 0.5, -0.5); }, {"LinearLr", "end_factor", "-0.5"});
  ExpectError([] { LinearLr(0.1, 0.5, 1.0, -2); }, {"LinearLr", "total_iters", "-2"});
  ExpectError([] { LinearLr(-0.1); }, {"LinearLr", "base_lr", "-0.1"});
  ExpectError([] { CosineAnnealingLr(0.1, 0); }, {"CosineAnnealingLr", "T_max", "0"});
  ExpectError([&] { CosineAnnealingLr(0.1, 10, nan); }, {"CosineAnnealingLr", "eta_min"});
  ExpectError([] { StepLr(0.1, 0); }, {"StepLr", "step_size", "0"});
  ExpectError([] { StepLr(0.1, 2, -0.5); }, {"StepLr", "gamma", "-0.5"});
  ExpectError([] { MultiStepLr(0.1, {5, 3}); }, {"MultiStepLr", "milestones[1]", "3"});
  ExpectError([] { MultiStepLr(0.1, {-1, 3}); }, {"MultiStepLr", "milestones[0]", "-1"});
  ExpectError([] { ExponentialLr(0.1, -0.9); }, {"ExponentialLr", "gamma", "-0.9"});
  ExpectError([] { PolynomialLr(0.1, 0); }, {"PolynomialLr", "total_iters", "0"});
  ExpectError([] { PolynomialLr(0.1, 5, -1.0); }, {"PolynomialLr", "power", "-1"});
  ExpectError([] { SequentialLr({}, {}); }, {"SequentialLr", "at least one"});
  ExpectError(
      [] {
        SequentialLr({ConstantSchedule(0.1), ConstantSchedule(0.2)}, {});
      },
      {"SequentialLr", "2 schedules", "0 milestones"});
  ExpectError(
      [] {
        SequentialLr({ConstantSchedule(0.1), ConstantSchedule(0.2), ConstantSchedule(0.3)}, {6, 2});
      },
      {"SequentialLr", "milestones[1]", "2"});
  ExpectError([] { WarmupCosine(0.1, 10, 10); }, {"WarmupCosine", "total_steps", "10"});
  ExpectError([] { WarmupCosine(0.1, -1, 10); }, {"WarmupCosine", "warmup_steps", "-1"});
  ExpectError([] { WarmupCosine(0.1, 2, 10, 0.0, 0.0); }, {"WarmupCosine", "warmup_start_factor"});
  ExpectError([] { LinearLr(0.1).Lr(-1); }, {"LinearLr", "step", "-1"});
  ExpectError([] { StepLr(0.1, 3).Lr(-5); }, {"StepLr", "step", "-5"});
}

TEST(Schedule, InvalidOneCycleArguments) {
  const auto with = [](const std::function<void(OneCycleOptions&)>& edit) {
    OneCycleOptions o;
    o.max_lr = 0.1;
    o.total_steps = 100;
    edit(o);
    return [o] { OneCycleLr(o); };
  };
  // torch: "Expected positive integer total_steps", "Expected float between 0 and 1 pct_start".
  ExpectError(with([](OneCycleOptions& o) { o.total_steps = 0; }), {"OneCycleLr", "total_steps"});
  ExpectError(with([](OneCycleOptions& o) { o.pct_start = 1.2; }),
              {"OneCycleLr", "pct_start", "1.2"});
  ExpectError(with([](OneCycleOptions& o) { o.pct_start = -0.1; }), {"pct_start", "-0.1"});
  ExpectError(with([](OneCycleOptions& o) { o.max_lr = -1; }), {"max_lr", "-1"});
  ExpectError(with([](OneCycleOptions& o) { o.div_factor = 0; }), {"div_factor", "0"});
  ExpectError(with([](OneCycleOptions& o) { o.final_div_factor = -1; }), {"final_div_factor"});
  ExpectError(with([](OneCycleOptions& o) { o.base_momentum = std::nan(""); }), {"base_momentum"});
  // pct_start * total_steps == 1 makes phase 0 zero steps long: torch's constructor divides by
  // zero (ZeroDivisionError) evaluating step 0; we refuse at construction too.
  ExpectError(with([](OneCycleOptions& o) { o.pct_start = 0.01; }), {"OneCycleLr", "zero length"});
  // Past total_steps, torch raises "Tried to step ... times"; so do we.
  OneCycleOptions o;
  o.max_lr = 0.1;
  o.total_steps = 100;
  const Schedule s = OneCycleLr(o);
  EXPECT_NO_THROW(s.Lr(100));
  ExpectError([&] { s.Lr(101); }, {"OneCycleLr", "step", "101", "total_steps"});
  ExpectError([&] { s.Momentum(101); }, {"OneCycleLr", "101"});
}

}  // namespace
}  // namespace fusedopt
