// LossScaler: torch.amp.GradScaler's update policy (the Python tests also compare it with torch's
// own GradScaler step by step), bounds, and argument checks.

#include "fusedopt/scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fusedopt/error.h"

namespace fusedopt {
namespace {

TEST(LossScaler, DefaultsAreTorchs) {
  const LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536.0f);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterAnIntervalOfGoodSteps) {
  LossScaler s({.init_scale = 1024.0f, .growth_interval = 3});
  const bool overflow[] = {false, false, true, false, false, false, false, true, true, false};
  // Hand-computed: two good steps (tracker 2), overflow halves and resets, three good steps double
  // (tracker back to 0), one good, two overflows halve twice, one good.
  const float want_scale[] = {1024, 1024, 512, 512, 512, 1024, 1024, 512, 256, 256};
  const long want_tracker[] = {1, 2, 0, 1, 2, 0, 1, 0, 0, 1};
  for (int i = 0; i < 10; ++i) {
    s.Update(overflow[i]);
    EXPECT_EQ(s.scale(), want_scale[i]) << "step " << i;
    EXPECT_EQ(s.growth_tracker(), want_tracker[i]) << "step " << i;
  }
}

TEST(LossScaler, GrowsOnlyToAFiniteScaleAndRespectsBounds) {
  LossScaler huge({.init_scale = 0x1p126f, .growth_factor = 4.0, .growth_interval = 1});
  huge.Update(false);
  EXPECT_EQ(huge.scale(), 0x1p126f);  // 2^128 would be Inf: kept
  EXPECT_EQ(huge.growth_tracker(), 0);

  LossScaler bounded(
      {.init_scale = 8.0f, .growth_interval = 1, .min_scale = 2.0f, .max_scale = 16.0f});
  for (int i = 0; i < 5; ++i) bounded.Update(false);
  EXPECT_EQ(bounded.scale(), 16.0f);
  for (int i = 0; i < 5; ++i) bounded.Update(true);
  EXPECT_EQ(bounded.scale(), 2.0f);
}

TEST(LossScaler, StaticNeverChanges) {
  LossScaler s = LossScaler::Static(128.0f);
  s.Update(true);
  s.Update(false);
  EXPECT_EQ(s.scale(), 128.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 128.0f);
}

TEST(LossScaler, InvScaleIsRoundedFromDouble) {
  const LossScaler s({.init_scale = 3.0f});
  EXPECT_EQ(s.inv_scale(), static_cast<float>(1.0 / 3.0));
}

TEST(LossScaler, RejectsBadOptionsAndRestoresState) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW(LossScaler({.init_scale = 0.0f}), Error);
  EXPECT_THROW(LossScaler({.init_scale = inf}), Error);
  EXPECT_THROW(LossScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(LossScaler({.backoff_factor = 1.0}), Error);
  EXPECT_THROW(LossScaler({.backoff_factor = 0.0}), Error);
  EXPECT_THROW(LossScaler({.growth_interval = 0}), Error);
  EXPECT_THROW(LossScaler({.init_scale = 8.0f, .min_scale = 16.0f}), Error);
  try {
    LossScaler({.growth_factor = 0.5});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("growth_factor"), std::string::npos) << e.what();
  }
  LossScaler s({.growth_interval = 10});
  s.Restore(256.0f, 7);
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.growth_tracker(), 7);
  EXPECT_THROW(s.Restore(256.0f, 10), Error);
  EXPECT_THROW(s.Restore(-1.0f, 0), Error);
  EXPECT_EQ(s.scale(), 256.0f);  // a rejected Restore changes nothing
}

}  // namespace
}  // namespace fusedopt
