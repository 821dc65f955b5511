// The doctor's distributed plan (src/doctor/distributed_plan.h) against numbers worked out by hand
// from the ring formulas (shared/docs/distributed.md §2, §3) and DistributedOptimizer's layout
// (buckets of P shards, each a multiple of kGrainElements = 32768, or of 256 elements where whole
// grains would pad a small model on many ranks by more than 1/8), written out again here rather
// than taken from the code: bytes sent per rank, memory per rank, the α-β times, padding, P = 1,
// the monotonicity in P, and bad options named with their flag and value. Diagnose is run once, for
// its JSON keys; its timings are never asserted (the machine is shared).

#include "src/doctor/distributed_plan.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/doctor/doctor.h"
#include "tests/doctor/expect_invalid.h"

namespace fusedopt::doctor {
namespace {

// AdamW (exp_avg and exp_avg_sq: 2 states) on one tensor of `numel` elements.
DoctorOptions Model(std::size_t numel, const std::string& dtype = "f32") {
  DoctorOptions o;
  o.optimizer = "adamw";
  o.numels = {numel};
  o.dtype = dtype;
  return o;
}

const DistributedRow& Row(const std::vector<DistributedRow>& plan, int ranks, int zero) {
  for (const DistributedRow& r : plan) {
    if (r.ranks == ranks && r.zero == zero) return r;
  }
  throw std::logic_error("no row");
}

using test::ExpectInvalid;

TEST(DistributedPlan, TheDocsExampleOneBillionParamsOnEightRanks) {
  // distributed.md §3: Ψ = 1e9, P = 8, f32 grads and params: DDP sends 2·7/8·4e9 = 7 GB per rank
  // and ZeRO-1 7 GB as well.
  DoctorOptions o = Model(1'000'000'000);
  o.ranks = {8};
  const std::vector<DistributedRow> plan = PlanDistributed(o, 100.0, 1000.0);
  ASSERT_EQ(plan.size(), 2u);
  // 25 MiB of f32: 6,553,600 elements a bucket, a shard of 819,200 = 25 grains per rank. 152 full
  // buckets hold 996,147,200 elements; the 3,852,800 left make a last bucket of 8 shards of
  // 481,600 rounded up to 15 grains, 491,520: 125,009,920 elements per rank, 1,000,079,360 in all.
  const double shards = 152.0 * 819'200 + 491'520;
  const double padded = 8 * shards;
  const DistributedRow& ddp = Row(plan, 8, 0);
  const DistributedRow& z1 = Row(plan, 8, 1);
  EXPECT_EQ(ddp.buckets, 153u);
  EXPECT_EQ(z1.state_elements, 152u * 819'200 + 491'520);
  // The collectives carry the padded buckets: AR 2·7/8 · padded · 4 B; RS + AG 7/8 · padded ·
  // (4 + 4) B.
  EXPECT_DOUBLE_EQ(ddp.bytes_sent, 2.0 * 7 / 8 * padded * 4);
  EXPECT_DOUBLE_EQ(z1.bytes_sent, 7.0 / 8 * padded * 8);
  EXPECT_NEAR(ddp.bytes_sent / 7e9, 1.0, 1e-4);
  EXPECT_NEAR(z1.bytes_sent / 7e9, 1.0, 1e-4);
  // §2 with our bytes (f32 params and grads, K = 8 B of AdamW state): DP (4 + 4 + 8)Ψ = 16Ψ;
  // ZeRO-1 (4 + 4)Ψ + (8 + 4)Ψ/P, the 4 being the reduced gradient shard; padding aside.
  EXPECT_DOUBLE_EQ(ddp.memory_bytes, padded * 8 + 1e9 * 8);
  EXPECT_DOUBLE_EQ(ddp.state_bytes, 8e9);
  EXPECT_DOUBLE_EQ(z1.memory_bytes, padded * 8 + shards * 12);
  EXPECT_NEAR(ddp.memory_bytes / 16e9, 1.0, 1e-4);
  EXPECT_NEAR(z1.memory_bytes / (8e9 + 12e9 / 8), 1.0, 1e-4);
}

TEST(DistributedPlan, TimesFollowTheAlphaBetaRing) {
  // 2^23 f32 elements in 16 MiB buckets: 2 buckets of n = 2^22, shards of 2^20 = 32 grains (no
  // padding). P = 4, 100 Gbit/s = 12.5e6 B/ms, α = 5 µs; the fused step takes 10 ms on all params,
  // the rest of the step 100 ms.
  DoctorOptions o = Model(std::size_t{1} << 23);
  o.ranks = {4};
  o.bucket_mb = 16.0;
  const std::vector<DistributedRow> plan = PlanDistributed(o, 10.0, 100.0);
  const double n = 4'194'304.0;
  const double beta = 12.5e6;
  const double hop_ms = 0.005;

  // zero=0: per bucket AR 2·3·α + 2·3/4·n·4 B / β.
  const DistributedRow& ddp = Row(plan, 4, 0);
  const double ar_ms = 6 * hop_ms + 1.5 * n * 4 / beta;
  EXPECT_EQ(ddp.buckets, 2u);
  EXPECT_DOUBLE_EQ(ddp.bytes_sent, 2 * 1.5 * n * 4);
  EXPECT_NEAR(ddp.comm_ms, 2 * ar_ms, 1e-9);
  EXPECT_NEAR(ddp.optimizer_ms, 10.0, 1e-9);
  EXPECT_NEAR(ddp.sequential_ms, 2 * ar_ms + 10.0, 1e-9);
  // Pipelined: the step (10 ms) is the longer stage; the first bucket's all-reduce is exposed.
  EXPECT_NEAR(ddp.pipelined_ms, 10.0 + ar_ms, 1e-9);
  EXPECT_NEAR(ddp.step_ms, 100.0 + 10.0 + ar_ms, 1e-9);
  EXPECT_NEAR(ddp.efficiency, 110.0 / (110.0 + ar_ms), 1e-12);
  EXPECT_NEAR(ddp.speedup, 4 * 110.0 / (110.0 + ar_ms), 1e-12);

  // zero=1: each rank's shard is n/4; RS + AG: 2·3·α +
  // 3·(n/4)·(4 + 4) B / β per bucket, the same volume as the all-reduce in f32; a quarter of the
  // step; the link (2 buckets' collectives) is now the longer stage.
  const DistributedRow& z1 = Row(plan, 4, 1);
  const double rs_ag_ms = 6 * hop_ms + 3 * (n / 4) * 8 / beta;
  EXPECT_DOUBLE_EQ(z1.bytes_sent, ddp.bytes_sent);
  EXPECT_NEAR(z1.comm_ms, 2 * rs_ag_ms, 1e-9);
  EXPECT_NEAR(z1.optimizer_ms, 2.5, 1e-9);
  EXPECT_NEAR(z1.sequential_ms, 2 * rs_ag_ms + 2.5, 1e-9);
  EXPECT_NEAR(z1.pipelined_ms, 2 * rs_ag_ms + rs_ag_ms, 1e-9);
  EXPECT_DOUBLE_EQ(z1.state_bytes, (n / 2) * 8);  // 2 shards of n/4, 8 B of state each
  EXPECT_DOUBLE_EQ(ddp.state_bytes, 2 * n * 8);

  // bf16 params: the all-gather moves 2 B per element, so ZeRO-1 sends less than the f32 AR.
  o.dtype = "bf16";
  const std::vector<DistributedRow> bf16 = PlanDistributed(o, 10.0, 100.0);
  EXPECT_DOUBLE_EQ(Row(bf16, 4, 0).bytes_sent, 2 * 1.5 * n * 4);  // grads travel as f32
  EXPECT_DOUBLE_EQ(Row(bf16, 4, 1).bytes_sent, 2 * 3 * (n / 4) * (4 + 2));
  // bf16 params (2n · 2 B), f32 grads (2n · 4 B) and their reduced shards (n/2 · 4 B), two bf16
  // states on the shards (n/2 · 4 B).
  EXPECT_DOUBLE_EQ(Row(bf16, 4, 1).memory_bytes, 2 * n * 2 + 2 * n * 4 + (n / 2) * 4 + (n / 2) * 4);
}

TEST(DistributedPlan, LatencyIsPerHopAndPerBucket) {
  // 600,000 elements in 1 MiB buckets (262,144 = 8 shards of one grain): 3 buckets, the last one
  // padded. Bandwidth all but infinite, α 10 µs, P = 8: each bucket's collectives take 2·7 hops,
  // for both stages.
  DoctorOptions o = Model(600'000);
  o.ranks = {8};
  o.bucket_mb = 1.0;
  o.link_latency_us = 10.0;
  o.link_gbps = 1e15;
  for (const DistributedRow& r : PlanDistributed(o, 1.0, 0.0)) {
    EXPECT_EQ(r.buckets, 3u);
    EXPECT_NEAR(r.comm_ms, 3 * 14 * 0.010, 1e-6) << "zero " << r.zero;
  }
}

TEST(DistributedPlan, OneRankSendsNothing) {
  DoctorOptions o = Model(1'000'000);
  o.ranks = {1};
  const std::vector<DistributedRow> plan = PlanDistributed(o, 3.0, 50.0);
  ASSERT_EQ(plan.size(), 2u);
  for (const DistributedRow& r : plan) {
    EXPECT_EQ(r.bytes_sent, 0.0);
    EXPECT_EQ(r.comm_ms, 0.0);
    EXPECT_DOUBLE_EQ(r.optimizer_ms, 3.0);
    EXPECT_DOUBLE_EQ(r.pipelined_ms, 3.0);
    EXPECT_DOUBLE_EQ(r.step_ms, 53.0);
    EXPECT_DOUBLE_EQ(r.speedup, 1.0);
    EXPECT_DOUBLE_EQ(r.efficiency, 1.0);
  }
  // zero=1 on one rank keeps everything, padded to 31 · 32768 = 1,015,808 elements.
  EXPECT_EQ(Row(plan, 1, 0).state_elements, 1'000'000u);
  EXPECT_EQ(Row(plan, 1, 1).state_elements, 1'015'808u);
}

TEST(DistributedPlan, ShardsArePaddedToTheAlignment) {
  // 1000 elements on 2 ranks: whole grains (32768 elements) would pad the model 65 times over, so
  // shards round up to 256 elements: one bucket of 2 shards of 512, and the collectives carry all
  // of it: AR 2·1/2 · 1024 · 4 B, RS + AG 1/2 · 1024 · (4 + 4) B.
  DoctorOptions o = Model(1000);
  o.ranks = {2};
  const std::vector<DistributedRow> plan = PlanDistributed(o, 1.0, 0.0);
  EXPECT_DOUBLE_EQ(Row(plan, 2, 0).bytes_sent, 1024.0 * 4);
  EXPECT_DOUBLE_EQ(Row(plan, 2, 1).bytes_sent, 512.0 * 8);
  EXPECT_EQ(Row(plan, 2, 1).state_elements, 512u);
  EXPECT_DOUBLE_EQ(Row(plan, 2, 0).param_bytes, 1024.0 * 4);
  // Rank 0 holds 512 of the 1000 real elements, the most: it steps 512/1000 of the model.
  EXPECT_DOUBLE_EQ(Row(plan, 2, 1).optimizer_ms, 0.512);
}

TEST(DistributedPlan, MoreRanksMeanLessStateUnderZeroOne) {
  DoctorOptions o = Model(100'000'000);
  o.ranks = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  const std::vector<DistributedRow> plan = PlanDistributed(o, 20.0, 200.0);
  ASSERT_EQ(plan.size(), 2 * o.ranks.size());
  for (std::size_t i = 1; i < o.ranks.size(); ++i) {
    const int p = o.ranks[i];
    const int q = o.ranks[i - 1];
    EXPECT_LE(Row(plan, p, 1).state_bytes, Row(plan, q, 1).state_bytes) << p;
    EXPECT_LE(Row(plan, p, 1).optimizer_ms, Row(plan, q, 1).optimizer_ms) << p;
    EXPECT_EQ(Row(plan, p, 0).state_bytes, Row(plan, q, 0).state_bytes) << p;
    // The ring's 2(P−1)/P · Ψ · 4 B, plus at most 1/8 of padding.
    const double ring = 2.0 * (p - 1) / p * 1e8 * 4;
    EXPECT_GE(Row(plan, p, 0).bytes_sent, ring) << p;
    EXPECT_LE(Row(plan, p, 0).bytes_sent, ring * 1.125) << p;
    EXPECT_LT(Row(plan, p, 1).memory_bytes, Row(plan, p, 0).memory_bytes) << p;
  }
  // At 1024 ranks whole grains per shard would pad 1e8 elements by a third, so shards round to 256
  // elements: 25 MiB buckets of 1024 shards of 6400, 16 buckets (the last one 1,696,000 elements,
  // shards of 1792), and each rank keeps 15 · 6400 + 1792 elements of 8 B.
  EXPECT_EQ(Row(plan, 1024, 1).buckets, 16u);
  EXPECT_DOUBLE_EQ(Row(plan, 1024, 1).state_bytes, (15 * 6400 + 1792) * 8.0);
  // Only the stage asked for.
  o.zero = 1;
  for (const DistributedRow& r : PlanDistributed(o, 20.0, 200.0)) EXPECT_EQ(r.zero, 1);
}

TEST(DistributedPlan, WholeTensorSumsAreNotSharded) {
  // AdamP's projection sums per channel row, which shards cut: DistributedOptimizer refuses
  // zero = 1 for it (LAMB's and LARS's per-tensor sums are completed across ranks).
  DoctorOptions o = Model(1000);
  o.optimizer = "adamp";
  o.ranks = {2, 4};
  const std::vector<DistributedRow> plan = PlanDistributed(o, 1.0, 1.0);
  ASSERT_EQ(plan.size(), 2u);
  for (const DistributedRow& r : plan) EXPECT_EQ(r.zero, 0);
  o.zero = 1;
  ExpectInvalid([&] { PlanDistributed(o, 1.0, 1.0); }, {"--zero", "adamp", "1"});
  o.optimizer = "lamb";
  for (const DistributedRow& r : PlanDistributed(o, 1.0, 1.0)) EXPECT_EQ(r.zero, 1);
}

TEST(DistributedPlan, BadOptionsNameTheFlagAndValue) {
  DoctorOptions o = Model(1000);
  const auto plan = [&] { PlanDistributed(o, 1.0, 1.0); };
  for (int p : {0, -3, 1025}) {
    o.ranks = {2, p};
    ExpectInvalid(plan, {"--ranks", std::to_string(p), "1..1024"});
  }
  o.ranks = {2};
  o.zero = 2;
  ExpectInvalid(plan, {"--zero", "2"});
  o.zero.reset();
  for (double gbps : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    o.link_gbps = gbps;
    ExpectInvalid(plan, {"--link-gbps", gbps == 0.0 ? "0" : gbps < 0 ? "-1" : "nan"});
  }
  o.link_gbps = 100.0;
  o.link_latency_us = -1.0;
  ExpectInvalid(plan, {"--link-latency-us", "-1"});
  o.link_latency_us = 5.0;
  for (double mb : {0.0, -1.0, 2e6}) {
    o.bucket_mb = mb;
    ExpectInvalid(plan, {"--bucket-mb", mb == 0.0 ? "0" : mb < 0 ? "-1" : "2e+06"});
  }
  o.bucket_mb = 25.0;
  o.dtype = "f64";
  ExpectInvalid(plan, {"dtype", "f64"});
  // Diagnose checks the plan's options before it times anything.
  o = Model(1000);
  o.step_ms = 10.0;
  o.optimizer_ms = 1.0;
  o.ranks = {4096};
  std::ostringstream sink;
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"--ranks", "4096"});
}

TEST(DistributedPlan, DiagnoseAppendsThePlan) {
  DoctorOptions o = Model(5000);
  o.step_ms = 10.0;
  o.optimizer_ms = 2.0;
  o.rounds = 2;
  o.threads = 1;
  o.ranks = {1, 8};
  std::ostringstream report, progress;
  const nlohmann::json j = Diagnose(o, report, progress);
  ASSERT_TRUE(j.contains("distributed"));
  ASSERT_EQ(j["distributed"].size(), 4u);
  for (const nlohmann::json& row : j["distributed"]) {
    for (const char* key :
         {"ranks", "zero", "buckets", "bytes_sent_per_rank", "memory_bytes_per_rank",
          "state_bytes_per_rank", "optimizer_ms", "comm_ms", "sequential_ms", "pipelined_ms",
          "predicted_step_ms", "speedup", "scaling_efficiency"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
  }
  // One rank predicts the single-rank fused step: the rest of the step (8 ms) + the fused step.
  EXPECT_DOUBLE_EQ(j["distributed"][0]["predicted_step_ms"].get<double>(),
                   j["predicted_step_ms"].get<double>());
  EXPECT_EQ(j["distributed_model"]["link_gbps"], 100.0);
  EXPECT_NE(report.str().find("distributed plan"), std::string::npos) << report.str();
}

}  // namespace
}  // namespace fusedopt::doctor
