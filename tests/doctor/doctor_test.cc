// The doctor's op model against counts worked out by hand for two tensors of 3 and 5 elements
// (T = 2 tensors, N = 8 elements), its trace reader on a hand-written timeline, and Diagnose's JSON
// (formulas only: timings are never asserted, the machine is shared).

#include "src/doctor/doctor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/doctor/expect_invalid.h"

namespace fusedopt::doctor {
namespace {

DoctorOptions Tiny(const std::string& optimizer, const std::string& dtype = "f32") {
  DoctorOptions o;
  o.optimizer = optimizer;
  o.numels = {3, 5};
  o.dtype = dtype;
  return o;
}

void ExpectCount(const OpCount& c, std::size_t ops, double passes, std::size_t bytes) {
  EXPECT_EQ(c.ops, ops);
  EXPECT_DOUBLE_EQ(c.passes, passes);
  EXPECT_EQ(c.bytes, bytes);
}

using test::ExpectInvalid;

TEST(DoctorCounts, SgdPlain) {
  // param.add_(grad, alpha=-lr): 1 op per tensor (2), reads param+grad, writes param: 3 passes;
  // bytes 3 × 8 × 4 = 96 (f32), 3 × 8 × 2 = 48 (bf16).
  ExpectCount(CountStandardOps(Tiny("sgd")), 2, 3, 96);
  ExpectCount(CountStandardOps(Tiny("sgd", "bf16")), 2, 3, 48);
  // Fused: one op; param r+w, grad r, no state: 3 passes, 96 bytes.
  ExpectCount(CountFusedOps(Tiny("sgd")), 1, 3, 96);
}

TEST(DoctorCounts, SgdWeightDecay) {
  DoctorOptions o = Tiny("sgd");
  o.weight_decay = 1e-4;
  // grad.add(param, alpha=wd) (r grad, param; w d_p: 3) + param.add_ (3): 2 ops × 2 tensors = 4,
  // 6 passes, 6 × 8 × 4 = 192 bytes. Fused: unchanged, 1 op, 3 passes, 96 bytes.
  ExpectCount(CountStandardOps(o), 4, 6, 192);
  ExpectCount(CountFusedOps(o), 1, 3, 96);
}

TEST(DoctorCounts, SgdMomentum) {
  DoctorOptions o = Tiny("sgd");
  o.momentum = 0.9;
  // buf.mul_ (2) + buf.add_(grad) (3) + param.add_(buf) (3): 3 ops × 2 = 6, 8 passes, 256 bytes.
  ExpectCount(CountStandardOps(o), 6, 8, 256);
  // Fused: param r+w 2, grad 1, momentum_buffer r+w 2 = 5 passes, 5 × 32 = 160 bytes.
  ExpectCount(CountFusedOps(o), 1, 5, 160);
  o.weight_decay = 1e-4;
  // + grad.add(param) (3): 4 ops × 2 = 8, 11 passes, 11 × 32 = 352 (f32), 11 × 16 = 176 (bf16).
  ExpectCount(CountStandardOps(o), 8, 11, 352);
  o.dtype = "bf16";
  ExpectCount(CountStandardOps(o), 8, 11, 176);
  ExpectCount(CountFusedOps(o), 1, 5, 80);  // 5 × 8 × 2
}

TEST(DoctorCounts, SgdNesterov) {
  DoctorOptions o = Tiny("sgd");
  o.momentum = 0.9;
  o.nesterov = true;
  // mul_ 2 + add_ 3 + grad.add(buf) 3 + param.add_ 3: 4 ops × 2 = 8, 11 passes, 352 bytes.
  ExpectCount(CountStandardOps(o), 8, 11, 352);
  ExpectCount(CountFusedOps(o), 1, 5, 160);
}

TEST(DoctorCounts, AdamW) {
  // Default weight decay 1e-2: param.mul_ 2, lerp_ 3, mul_ 2, addcmul_ 3 (grad read once),
  // sqrt 2, div 2, add_ 2, addcdiv_ 4 = 20 passes; 8 ops × 2 = 16; 20 × 32 = 640 bytes.
  ExpectCount(CountStandardOps(Tiny("adamw")), 16, 20, 640);
  ExpectCount(CountStandardOps(Tiny("adamw", "bf16")), 16, 20, 320);
  // Fused: param 2 + grad 1 + exp_avg 2 + exp_avg_sq 2 = 7 passes: 224 (f32), 112 (bf16) bytes,
  // bench's bytes_per_param 28 (f32) × 8.
  ExpectCount(CountFusedOps(Tiny("adamw")), 1, 7, 224);
  ExpectCount(CountFusedOps(Tiny("adamw", "bf16")), 1, 7, 112);
  DoctorOptions no_wd = Tiny("adamw");
  no_wd.weight_decay = 0.0;
  // Without weight decay torch skips param.mul_: 7 ops × 2 = 14, 18 passes, 576 bytes.
  ExpectCount(CountStandardOps(no_wd), 14, 18, 576);
}

TEST(DoctorCounts, Adam) {
  // Default weight decay 0: as AdamW without it: 14 ops, 18 passes, 576 bytes.
  ExpectCount(CountStandardOps(Tiny("adam")), 14, 18, 576);
  DoctorOptions o = Tiny("adam");
  o.weight_decay = 1e-4;
  // + grad.add(param, alpha=wd) (3): 8 ops × 2 = 16, 21 passes, 672 bytes.
  ExpectCount(CountStandardOps(o), 16, 21, 672);
  ExpectCount(CountFusedOps(o), 1, 7, 224);
}

TEST(DoctorCounts, RmspropAndAdagrad) {
  // RMSprop: mul_ 2, addcmul_ 3, sqrt 2, add_ 2, addcdiv_ 4 = 13 passes; 5 ops × 2 = 10; 416 B.
  ExpectCount(CountStandardOps(Tiny("rmsprop")), 10, 13, 416);
  ExpectCount(CountFusedOps(Tiny("rmsprop")), 1, 5, 160);  // square_avg r+w
  // Adagrad: addcmul_ 3, sqrt 2, add_ 2, addcdiv_ 4 = 11 passes; 4 ops × 2 = 8; 352 bytes.
  ExpectCount(CountStandardOps(Tiny("adagrad")), 8, 11, 352);
  ExpectCount(CountFusedOps(Tiny("adagrad")), 1, 5, 160);  // sum r+w
}

TEST(DoctorCounts, Clip) {
  DoctorOptions o = Tiny("adamw");
  o.clip = 1.0;
  // clip_grad_norm_: a norm per tensor (2 ops, read: 1 pass), stack + norm (2), clamp (1), a mul_
  // per tensor (2 ops, r+w: 2 passes): 7 ops, 3 passes. AdamW 16 ops, 20 passes: 23 ops,
  // 23 passes, 23 × 32 = 736 bytes.
  ExpectCount(CountStandardOps(o), 23, 23, 736);
  // Fused: pre-pass (1 op, grad read: 1 pass) + step (1 op, 7 passes): 2 ops, 8 passes, 256 B.
  ExpectCount(CountFusedOps(o), 2, 8, 256);
  o.optimizer = "sgd";
  o.dtype = "bf16";
  // SGD plain 2 ops, 3 passes + clip 7 ops, 3 passes: 9 ops, 6 passes, 6 × 16 = 96 bytes.
  ExpectCount(CountStandardOps(o), 9, 6, 96);
  ExpectCount(CountFusedOps(o), 2, 4, 64);  // 4 × 16
}

TEST(DoctorCounts, Lamb) {
  // Default weight decay 1e-2 (apex's), AdamW mode, per tensor: the global norm's vector_norm(g) 1,
  // sg = g.clone() 2, exp_avg.mul_ 2, .add_(sg) 3, exp_avg_sq.mul_ 2, .addcmul_(sg, sg) 3,
  // exp_avg / bc1 2, exp_avg_sq / bc2 2, .sqrt() 2, + eps 2, u = m_hat / denom 3, u.add_(p) 3,
  // p.norm() 1, u.norm() 1, p.add_(u) 3 = 32 passes; 15 ops × 2 = 30; 32 × 32 = 1024 bytes.
  ExpectCount(CountStandardOps(Tiny("lamb")), 30, 32, 1024);
  // Fused: the reduction pass (param, grad, exp_avg, exp_avg_sq read: 4) and the update (param 2,
  // grad 1, two states 4: 7): 2 ops, 11 passes, 352 bytes (bench's bytes_per_param 44 × 8).
  ExpectCount(CountFusedOps(Tiny("lamb")), 2, 11, 352);
  DoctorOptions o = Tiny("lamb", "bf16");
  o.weight_decay = 0.0;
  // Without weight decay no u.add_(p): 14 ops × 2 = 28, 29 passes, 29 × 16 = 464 bytes.
  ExpectCount(CountStandardOps(o), 28, 29, 464);
  ExpectCount(CountFusedOps(o), 2, 11, 176);
  o.clip = 1.0;
  // + clip_grad_norm_'s 7 ops and 3 passes (its own clip runs before LAMB's): 35 ops, 32 passes;
  // fused + the pre-pass: 3 ops, 12 passes.
  ExpectCount(CountStandardOps(o), 35, 32, 512);
  ExpectCount(CountFusedOps(o), 3, 12, 192);
}

// A reduction pass counts what it reads (baselines::ReductionTraffic), as `fusedopt bench` does.
TEST(DoctorCounts, ReductionPassesCountWhatTheyRead) {
  // LARS (the doctor takes no momentum for it): ‖p‖² and ‖g‖² read the param and the grad (2), the
  // update the param 2 and the grad 1: 2 ops, 5 passes, 5 × 32 = 160 bytes.
  ExpectCount(CountFusedOps(Tiny("lars")), 2, 5, 160);
  // BertAdam (clipping at 1.0 by default): the gradient norm reads the grad only (1), the update
  // 7 (AdamW's): 2 ops, 8 passes.
  ExpectCount(CountFusedOps(Tiny("bert_adam")), 2, 8, 256);
  // AdamP on the doctor's vectors: never projected, so no reduction pass at all: AdamW's 1 op and
  // 7 passes.
  ExpectCount(CountFusedOps(Tiny("adamp")), 1, 7, 224);
}

TEST(DoctorCounts, Adafactor) {
  // The doctor's tensors are vectors (numels only): param.norm() 1, grad * grad 2,
  // variance.lerp_ 3, .clone() 2, .clamp_ 2, .rsqrt_() 2, update.mul_(grad) 3, update.norm() 1,
  // param.add_ 3 = 19 passes; 9 ops × 2 = 18; 19 × 32 = 608 bytes.
  ExpectCount(CountStandardOps(Tiny("adafactor")), 18, 19, 608);
  // Fused: the stats pass (param, grad, variance read: 3) and the update (param 2, grad 1,
  // variance 2: 5): 2 ops, 8 passes, 256 bytes (bench's bytes_per_param 32 × 8).
  ExpectCount(CountFusedOps(Tiny("adafactor")), 2, 8, 256);
  DoctorOptions o = Tiny("adafactor", "bf16");
  o.weight_decay = 0.1;
  // + param.mul_(1 - lr * wd) 2: 10 ops × 2 = 20, 21 passes, 21 × 16 = 336 bytes.
  ExpectCount(CountStandardOps(o), 20, 21, 336);
  ExpectCount(CountFusedOps(o), 2, 8, 128);
}

// The per-tensor op lists the doctor wrote out by hand before the descriptors held the op
// sequences ({reads, writes} of each op, torch's defaults for what the doctor does not take):
// CountStandardOps, now counting StandardStep, must give exactly what they gave, for every
// optimizer and option the doctor takes.
std::vector<std::pair<int, int>> HandWrittenOps(const std::string& optimizer, double wd,
                                                double momentum, bool nesterov) {
  std::vector<std::pair<int, int>> ops;
  if (optimizer == "sgd") {
    if (wd != 0.0) ops.push_back({2, 1});  // d_p = grad.add(param, alpha=wd): a new tensor
    if (momentum != 0.0) {
      ops.push_back({1, 1});                // buf.mul_(momentum)
      ops.push_back({2, 1});                //    .add_(d_p, alpha=1-dampening)
      if (nesterov) ops.push_back({2, 1});  // d_p = d_p.add(buf, alpha=momentum)
    }
    ops.push_back({2, 1});  // param.add_(d_p, alpha=-lr)
  } else if (optimizer == "adam" || optimizer == "adamw") {
    if (wd != 0.0 && optimizer == "adamw") ops.push_back({1, 1});  // param.mul_(1-lr*wd)
    if (wd != 0.0 && optimizer == "adam") ops.push_back({2, 1});   // grad.add(param, wd)
    ops.insert(ops.end(), {{2, 1}, {1, 1}, {2, 1}, {1, 1}, {1, 1}, {1, 1}, {3, 1}});
  } else if (optimizer == "rmsprop") {
    if (wd != 0.0) ops.push_back({2, 1});
    ops.insert(ops.end(), {{1, 1}, {2, 1}, {1, 1}, {1, 1}});
    if (momentum > 0.0) {
      ops.insert(ops.end(), {{1, 1}, {3, 1}, {2, 1}});
    } else {
      ops.push_back({3, 1});
    }
  } else if (optimizer == "adagrad") {
    if (wd != 0.0) ops.push_back({2, 1});
    ops.insert(ops.end(), {{2, 1}, {1, 1}, {1, 1}, {3, 1}});
  } else if (optimizer == "lion") {
    ops.insert(ops.end(), {{1, 1}, {1, 1}, {1, 1}, {2, 1}, {1, 1}, {2, 1}, {1, 1}, {2, 1}});
  }
  return ops;
}

TEST(DoctorCounts, MatchTheHandWrittenModel) {
  constexpr double kDefault = std::numeric_limits<double>::quiet_NaN();
  int checked = 0;
  for (const std::string optimizer : {"sgd", "adam", "adamw", "rmsprop", "adagrad", "lion"}) {
    const bool has_momentum = optimizer == "sgd" || optimizer == "rmsprop";
    for (const double wd : {kDefault, 0.0, 1e-4, 0.1}) {
      for (const double momentum : {0.0, 0.9}) {
        if (momentum != 0.0 && !has_momentum) continue;
        for (const bool nesterov : {false, true}) {
          if (nesterov && (optimizer != "sgd" || momentum == 0.0)) continue;
          for (const bool clip : {false, true}) {
            for (const std::string dtype : {"f32", "bf16", "f16"}) {
              for (const std::vector<std::size_t>& numels :
                   {std::vector<std::size_t>{3, 5}, std::vector<std::size_t>{7, 1, 4096}}) {
                DoctorOptions o = Tiny(optimizer, dtype);
                o.numels = numels;
                o.weight_decay = wd;
                o.momentum = momentum;
                o.nesterov = nesterov;
                if (clip) o.clip = 1.0;
                const double effective_wd =
                    std::isnan(wd) ? (optimizer == "adamw" ? 1e-2 : 0.0) : wd;
                std::size_t ops = 0;
                std::size_t passes = 0;
                for (const auto& [reads, writes] :
                     HandWrittenOps(optimizer, effective_wd, momentum, nesterov)) {
                  ops += numels.size();
                  passes += static_cast<std::size_t>(reads + writes);
                }
                if (clip) {
                  ops += 2 * numels.size() + 3;
                  passes += 3;
                }
                std::size_t numel = 0;
                for (const std::size_t n : numels) numel += n;
                const std::size_t size = dtype == "f32" ? 4 : 2;
                SCOPED_TRACE(optimizer + " wd " + std::to_string(wd) + " momentum " +
                             std::to_string(momentum) + (nesterov ? " nesterov" : "") +
                             (clip ? " clip" : "") + " " + dtype);
                ExpectCount(CountStandardOps(o), ops, static_cast<double>(passes),
                            passes * numel * size);
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 432);  // 36 option sets × clip × 3 dtypes × 2 shapes
}

// Two implementations; step 0 is a warm-up in both (its spans are huge, and must not count).
nlohmann::json TinyTrace() {
  return nlohmann::json::parse(R"({
    "displayTimeUnit": "ms",
    "otherData": {"fusedopt_trace": 1, "model": "tiny", "optimizer": "sgd", "threads": 1,
                  "dtype": "bf16", "param_dtype": "bf16", "param_numels": [3, 5], "lr": 0.1,
                  "weight_decay": 0.0001, "momentum": 0.9, "nesterov": false,
                  "max_grad_norm": 1.0, "impls": {"1": "torch", "2": "fused"}},
    "traceEvents": [
      {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "torch::optim::SGD"}},
      {"name": "step", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 500000,
       "args": {"step": 0, "warmup": true}},
      {"name": "optimizer", "ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 90000,
       "args": {"step": 0}},
      {"name": "step", "ph": "X", "pid": 1, "tid": 1, "ts": 1, "dur": 100000,
       "args": {"step": 1, "warmup": false}},
      {"name": "optimizer", "ph": "X", "pid": 1, "tid": 1, "ts": 2, "dur": 20000,
       "args": {"step": 1}},
      {"name": "forward", "ph": "X", "pid": 1, "tid": 1, "ts": 2, "dur": 70000,
       "args": {"step": 1}},
      {"name": "step", "ph": "X", "pid": 1, "tid": 1, "ts": 3, "dur": 120000,
       "args": {"step": 2, "warmup": false}},
      {"name": "optimizer", "ph": "X", "pid": 1, "tid": 1, "ts": 4, "dur": 30000,
       "args": {"step": 2}},
      {"name": "step", "ph": "X", "pid": 1, "tid": 1, "ts": 5, "dur": 110000,
       "args": {"step": 3, "warmup": false}},
      {"name": "optimizer", "ph": "X", "pid": 1, "tid": 1, "ts": 6, "dur": 25000,
       "args": {"step": 3}},
      {"name": "step", "ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 400000,
       "args": {"step": 0, "warmup": true}},
      {"name": "step", "ph": "X", "pid": 2, "tid": 1, "ts": 7, "dur": 90000,
       "args": {"step": 1, "warmup": false}},
      {"name": "optimizer", "ph": "X", "pid": 2, "tid": 1, "ts": 8, "dur": 5000,
       "args": {"step": 1}},
      {"name": "step", "ph": "X", "pid": 2, "tid": 1, "ts": 9, "dur": 95000,
       "args": {"step": 2, "warmup": false}},
      {"name": "optimizer", "ph": "X", "pid": 2, "tid": 1, "ts": 10, "dur": 6000,
       "args": {"step": 2}}
    ]})");
}

TEST(DoctorTrace, PicksTheStandardImplAndMedians) {
  const DoctorOptions o = DoctorOptionsFromTrace(TinyTrace());
  EXPECT_EQ(o.impl, "torch");
  EXPECT_EQ(o.optimizer, "sgd");
  EXPECT_EQ(o.dtype, "bf16");
  EXPECT_EQ(o.numels, (std::vector<std::size_t>{3, 5}));
  EXPECT_DOUBLE_EQ(o.weight_decay, 1e-4);
  EXPECT_DOUBLE_EQ(o.momentum, 0.9);
  EXPECT_FALSE(o.nesterov);
  ASSERT_TRUE(o.clip.has_value());
  EXPECT_DOUBLE_EQ(*o.clip, 1.0);
  EXPECT_EQ(o.threads, 1);
  // Steps 1-3 of pid 1: 100, 120, 110 ms -> 110; their optimizer spans 20, 30, 25 -> 25 (the
  // warm-up's 500 and 90 ms left out).
  EXPECT_DOUBLE_EQ(o.step_ms, 110.0);
  ASSERT_TRUE(o.optimizer_ms.has_value());
  EXPECT_DOUBLE_EQ(*o.optimizer_ms, 25.0);
  EXPECT_EQ(o.optimizer_ms_source, "trace");
  // pid 2 (fused): steps 90 and 95 ms -> 92.5.
  ASSERT_TRUE(o.trace_fused_step_ms.has_value());
  EXPECT_DOUBLE_EQ(*o.trace_fused_step_ms, 92.5);
}

TEST(DoctorTrace, OnlyFusedIsDiagnosedAsAlreadyFused) {
  nlohmann::json trace = TinyTrace();
  trace["otherData"]["impls"] = {{"2", "fused"}};
  const DoctorOptions o = DoctorOptionsFromTrace(trace);
  EXPECT_EQ(o.impl, "fused");
  EXPECT_DOUBLE_EQ(o.step_ms, 92.5);
  EXPECT_DOUBLE_EQ(*o.optimizer_ms, 5.5);
  EXPECT_FALSE(o.trace_fused_step_ms.has_value());
}

TEST(DoctorTrace, MissingFieldsAreNamed) {
  nlohmann::json trace = TinyTrace();
  trace["otherData"].erase("param_numels");
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"param_numels"});
  trace = TinyTrace();
  trace["otherData"].erase("optimizer");
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"optimizer"});
  trace = TinyTrace();
  trace["otherData"].erase("impls");
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"impls"});
  trace = TinyTrace();
  trace.erase("traceEvents");
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"traceEvents"});
  // No optimizer span in a non-warm-up step of the torch process.
  trace = TinyTrace();
  nlohmann::json kept = nlohmann::json::array();
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (!(e["name"] == "optimizer" && e["pid"] == 1 && e["args"]["step"] != 0)) kept.push_back(e);
  }
  trace["traceEvents"] = kept;
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"optimizer", "torch"});
}

TEST(DoctorDiagnose, JsonFollowsTheFormulas) {
  DoctorOptions o = Tiny("adamw");
  o.step_ms = 10.0;
  o.optimizer_ms = 2.0;
  o.rounds = 3;
  o.threads = 1;
  std::ostringstream report, progress;
  const nlohmann::json j = Diagnose(o, report, progress);
  for (const char* key :
       {"optimizer", "num_tensors", "numel", "step_ms", "optimizer_ms", "optimizer_share",
        "standard", "fused", "measured", "amdahl_bound", "predicted_step_ms", "predicted_speedup",
        "predicted_bound_gain_captured", "verdict", "optimizer_ms_source"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"fused_ms", "same_traffic_ms", "ceiling_gb_per_s", "standard_gb_per_s"})
    EXPECT_TRUE(j["measured"].contains(key)) << key;
  EXPECT_EQ(j["num_tensors"], 2);
  EXPECT_EQ(j["numel"], 8);
  EXPECT_EQ(j["optimizer_ms_source"], "given");
  EXPECT_EQ(j["standard"]["ops"], 16);
  EXPECT_EQ(j["fused"]["bytes"], 224);
  EXPECT_DOUBLE_EQ(j["optimizer_share"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(j["amdahl_bound"].get<double>(), 10.0 / 8.0);
  const double fused_ms = j["measured"]["fused_ms"];
  EXPECT_GT(fused_ms, 0.0);
  EXPECT_DOUBLE_EQ(j["predicted_step_ms"].get<double>(), 10.0 - 2.0 + fused_ms);
  const double speedup = 10.0 / (8.0 + fused_ms);
  EXPECT_DOUBLE_EQ(j["predicted_speedup"].get<double>(), speedup);
  EXPECT_NEAR(j["predicted_bound_gain_captured"].get<double>(), (speedup - 1.0) / 0.25, 1e-12);
  // standard_gb_per_s: 640 bytes in 2 ms.
  EXPECT_DOUBLE_EQ(j["measured"]["standard_gb_per_s"].get<double>(), 640.0 / 2e6);
  EXPECT_NE(report.str().find("verdict: The optimizer is 20 % of your step"), std::string::npos)
      << report.str();
}

TEST(DoctorDiagnose, MeasuresTheStandardWhenNotGiven) {
  DoctorOptions o = Tiny("sgd");
  o.momentum = 0.9;
  o.clip = 1.0;
  o.step_ms = 1e6;  // far above the few microseconds a step of 8 elements takes
  o.rounds = 3;
  std::ostringstream report, progress;
  const nlohmann::json j = Diagnose(o, report, progress);
  EXPECT_EQ(j["optimizer_ms_source"], "measured");
  EXPECT_DOUBLE_EQ(j["optimizer_ms"].get<double>(), j["measured"]["standard_ms"].get<double>());
  EXPECT_NE(report.str().find("not your bottleneck"), std::string::npos) << report.str();
}

TEST(DoctorDiagnose, AlreadyFusedPredictsNoChange) {
  DoctorOptions o = DoctorOptionsFromTrace(TinyTrace());
  o.impl = "fused";
  o.rounds = 2;
  std::ostringstream report, progress;
  const nlohmann::json j = Diagnose(o, report, progress);
  EXPECT_TRUE(j["already_fused"].get<bool>());
  EXPECT_DOUBLE_EQ(j["predicted_speedup"].get<double>(), 1.0);
  EXPECT_TRUE(j["predicted_bound_gain_captured"].is_null());
  EXPECT_NE(j["verdict"].get<std::string>().find("already uses fusedopt"), std::string::npos);
}

TEST(DoctorBadInput, NamesTheFieldAndValue) {
  std::ostringstream sink;
  DoctorOptions o = Tiny("no_such_optimizer");
  o.step_ms = 10.0;
  // Every optimizer of the registry is known, lamb included.
  ExpectInvalid([&] { CountStandardOps(o); }, {"optimizer", "no_such_optimizer",
                                               "sgd, adam, adamw, rmsprop, adagrad, lion, lamb"});
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"optimizer", "no_such_optimizer"});
  o = Tiny("adamw");
  o.step_ms = 0.0;
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"step_ms", "0"});
  o.step_ms = -3.0;
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"step_ms", "-3"});
  o.step_ms = 10.0;
  o.optimizer_ms = 12.5;
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"optimizer_ms", "12.5"});
  o.optimizer_ms = 10.0;
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"optimizer_ms", "10"});
  o = Tiny("adamw");
  o.numels.clear();
  o.step_ms = 10.0;
  ExpectInvalid([&] { CountFusedOps(o); }, {"numels"});
  ExpectInvalid([&] { Diagnose(o, sink, sink); }, {"numels"});
  o = Tiny("adamw", "f64");
  ExpectInvalid([&] { CountStandardOps(o); }, {"dtype", "f64"});
  o = Tiny("sgd");
  o.nesterov = true;
  ExpectInvalid([&] { CountStandardOps(o); }, {"nesterov"});
  o = Tiny("adamw");
  o.clip = -1.0;
  ExpectInvalid([&] { CountStandardOps(o); }, {"clip", "-1"});
}

// Every otherData field the doctor reads is validated: a wrong type, an impossible value or an
// unknown format version is an error naming the field and the value, never silently used or
// ignored (issue #11, items 1 and 10).
TEST(DoctorTrace, RejectsNonsenseFields) {
  const auto with = [](const std::string& key, const nlohmann::json& value) {
    nlohmann::json trace = TinyTrace();
    trace["otherData"][key] = value;
    return trace;
  };
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("fusedopt_trace", 99)); },
                {"fusedopt_trace", "99"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("fusedopt_trace", "1")); }, {"fusedopt_trace"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("threads", 1e9)); }, {"threads", "1e+09"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("threads", -1)); }, {"threads", "-1"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("threads", 1.5)); }, {"threads", "1.5"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("param_dtype", 16)); }, {"param_dtype", "16"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("nesterov", "yes")); }, {"nesterov", "yes"});
  ExpectInvalid([&] { DoctorOptionsFromTrace(with("momentum", "0.9")); }, {"momentum"});
  ExpectInvalid(
      [&] {
        DoctorOptionsFromTrace(with("param_numels", {3, 0}));
      },
      {"param_numels", "0"});
  nlohmann::json trace = TinyTrace();
  trace["otherData"].erase("fusedopt_trace");
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"fusedopt_trace"});
  trace = TinyTrace();
  trace["traceEvents"][1]["dur"] = -5;
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"dur", "-5"});
  trace = TinyTrace();
  trace["traceEvents"][3]["args"]["warmup"] = "no";
  ExpectInvalid([&] { DoctorOptionsFromTrace(trace); }, {"warmup"});
}

// Sizes from a trace are summed and multiplied with checked arithmetic before anything is
// allocated: these used to wrap around and crash in Diagnose.
TEST(DoctorTrace, ImpossibleSizesAreErrors) {
  std::ostringstream sink;
  const auto diagnose = [&](const nlohmann::json& numels) {
    nlohmann::json trace = TinyTrace();
    trace["otherData"]["param_numels"] = numels;
    DoctorOptions o = DoctorOptionsFromTrace(trace);
    o.rounds = 1;
    Diagnose(o, sink, sink);
  };
  const std::uint64_t big = std::uint64_t{1} << 62;
  const std::uint64_t max63 = (std::uint64_t{1} << 63) - 1;
  ExpectInvalid([&] { diagnose({big}); }, {"param_numels"});
  ExpectInvalid([&] { diagnose({max63, max63}); }, {"param_numels"});
  // Representable but larger than any machine: "needs N GiB".
  ExpectInvalid([&] { diagnose({std::uint64_t{1} << 44}); }, {"needs", "GiB"});
}

}  // namespace
}  // namespace fusedopt::doctor
