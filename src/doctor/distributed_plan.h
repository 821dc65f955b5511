// The doctor's distributed plan: what data parallel (zero=0) and ZeRO-1 (zero=1) would cost per
// rank at P ranks, on paper, from the single-rank numbers: bytes sent, memory, optimizer,
// communication and step time. A pure function of the options and two measured times, so it is
// tested without timing. It lays the model out exactly as DistributedOptimizer does (ShardLayout,
// include/fusedopt/distributed.h: buckets of `bucket_mb` MiB of f32 gradients, each P shards padded
// to kGrainElements, and the collectives carry the padding too): zero=0 all-reduces each bucket
// and steps every parameter; zero=1 reduce-scatters each bucket, steps the rank's shard (state at
// shard size) and all-gathers the params in their dtype. Times follow an alpha-beta ring model
// (docs/doctor.md, "The distributed plan").
#pragma once

#include <cstddef>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <vector>

#include "src/doctor/doctor.h"

namespace fusedopt::doctor {

inline constexpr int kMaxPlanRanks = 1024;

// One world size and ZeRO stage. Bytes are per rank per step; times in ms.
struct DistributedRow {
  int ranks = 1;
  int zero = 0;
  std::size_t buckets = 0;  // collectives per step: all-reduces (zero=0), or RS + AG pairs
  // Elements whose state each rank keeps: numel (zero=0), the padded shards (zero=1).
  std::size_t state_elements = 0;
  double bytes_sent = 0.0;     // ring volume: all-reduces, or reduce-scatters + all-gathers
  double param_bytes = 0.0;    // the padded params, on every rank
  double grad_bytes = 0.0;     // the padded f32 grads (+ zero=1: the reduced shards)
  double state_bytes = 0.0;    // optimizer state (in the param dtype, as the doctor's)
  double memory_bytes = 0.0;   // params + grads + state
  double optimizer_ms = 0.0;   // the fused step on this rank's elements (the busiest rank)
  double comm_ms = 0.0;        // every collective, α-β
  double sequential_ms = 0.0;  // comm + optimizer: all communication, then the step
  double pipelined_ms = 0.0;   // the step of bucket k overlapping the collectives of bucket k+1
  double step_ms = 0.0;        // the rest of the step + pipelined_ms
  double speedup = 1.0;        // samples per second vs one rank: P · step(1) / step(P)
  double efficiency = 1.0;     // step(1) / step(P)
};

// Throws std::invalid_argument naming the flag and the value: ranks each 1..kMaxPlanRanks, zero 0
// or 1 (not 1 for an optimizer with whole-tensor sums), link_gbps > 0, link_latency_us >= 0,
// bucket_mb in (0, 1 TiB].
void CheckDistributedOptions(const DoctorOptions& options);

// The plan for every world size of options.ranks (in that order), zero=0 then zero=1 for each
// (only options.zero when set; no zero=1 for an optimizer that is not FusedFootprint::shardable).
// `fused_ms`: the fused step on all params on one rank (measured); `rest_ms`: the training step
// without its optimizer (forward, backward, data), which each rank keeps at its batch size (weak
// scaling: the global batch grows with P). Validates the options.
std::vector<DistributedRow> PlanDistributed(const DoctorOptions& options, double fused_ms,
                                            double rest_ms);

// The report's table (with the model's parameters in its heading), and the JSON of the rows and of
// those parameters.
void PrintDistributedPlan(std::ostream& out, const DoctorOptions& options,
                          const std::vector<DistributedRow>& plan);
nlohmann::json DistributedJson(const std::vector<DistributedRow>& plan);
nlohmann::json DistributedModelJson(const DoctorOptions& options);

}  // namespace fusedopt::doctor
