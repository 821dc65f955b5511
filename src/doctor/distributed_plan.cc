#include "src/doctor/distributed_plan.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <stdexcept>
#include <string>

#include "fusedopt/distributed.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/runtime.h"
#include "src/doctor/checks.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using tools::Fixed;
using tools::Num;

namespace {

// The engine reduces gradients in f32 whatever the param dtype (DistributedOptimizer requires f32
// grads: MPI has no 16-bit float type), so buckets are sized, held and sent in f32.
constexpr std::size_t kGradBytes = sizeof(float);
constexpr double kBytesPerMiB = 1024.0 * 1024.0;
constexpr double kMaxBucketMiB = 1024.0 * 1024.0;  // 1 TiB: far past any useful bucket

// DistributedOptions::bucket_bytes for `bucket_mb` MiB, and the engine's elements per bucket.
std::size_t BucketElements(const DoctorOptions& o) {
  const auto bytes = static_cast<std::size_t>(std::ceil(o.bucket_mb * kBytesPerMiB));
  return (bytes + kGradBytes - 1) / kGradBytes;
}

DistributedRow PlanOne(const DoctorOptions& o, const FusedFootprint& f, const ShardLayout& layout,
                       int zero, double fused_ms, double rest_ms) {
  const int ranks = layout.ranks;
  const auto p = static_cast<std::size_t>(ranks);
  const double hops = static_cast<double>(ranks - 1);
  const double alpha_ms = o.link_latency_us / 1000.0;
  const double beta_bytes_per_ms = o.link_gbps * 1e9 / 8.0 / 1000.0;
  const double numel = static_cast<double>(f.numel);

  DistributedRow row;
  row.ranks = ranks;
  row.zero = zero;
  row.buckets = layout.buckets.size();
  row.state_elements = zero == 0 ? layout.numel : layout.shard_total;
  double first_comm_ms = 0.0;  // the first bucket's collectives: no step can hide them
  for (std::size_t k = 0; k < layout.buckets.size(); ++k) {
    const ShardLayout::Bucket& b = layout.buckets[k];
    // A bucket is P shards; the collectives carry all of it, its padding too.
    const double shard = static_cast<double>(b.shard);
    const std::size_t real = std::min(p * b.shard, layout.numel - b.begin);
    double bytes = 0.0;
    double stepped = static_cast<double>(real);  // elements the busiest rank steps
    if (zero == 0) {
      // Ring all-reduce of the P·shard f32 sums: 2(P-1)/P of them, 2(P-1) hops.
      bytes = 2.0 * hops * shard * kGradBytes;
    } else {
      // Ring reduce-scatter of the f32 grads, then all-gather of the params in their dtype:
      // (P-1)/P of the bucket each, (P-1) hops each. Rank 0's shard holds the most real elements.
      bytes = hops * shard * static_cast<double>(kGradBytes + f.param);
      stepped = static_cast<double>(std::min(b.shard, real));
    }
    const double comm_ms = 2.0 * hops * alpha_ms + bytes / beta_bytes_per_ms;
    if (k == 0) first_comm_ms = comm_ms;
    row.bytes_sent += bytes;
    row.comm_ms += comm_ms;
    // The fused step's time is taken as proportional to the elements it steps.
    row.optimizer_ms += fused_ms * (stepped / numel);
  }
  // The engine's buffers: params and f32 grads over the padded range on every rank, ZeRO-1's
  // reduced gradient shards, and the states at numel (zero=0) or at the shards' size (zero=1).
  const double padded = static_cast<double>(layout.padded);
  row.param_bytes = padded * static_cast<double>(f.param);
  row.grad_bytes = padded * kGradBytes;
  if (zero == 1) row.grad_bytes += static_cast<double>(layout.shard_total) * kGradBytes;
  row.state_bytes = static_cast<double>(row.state_elements) * static_cast<double>(f.state);
  row.memory_bytes = row.param_bytes + row.grad_bytes + row.state_bytes;
  row.sequential_ms = row.comm_ms + row.optimizer_ms;
  // Two stages over the buckets (the link, the step): the longer one plus the first bucket's
  // collectives, which nothing hides; never worse than not overlapping at all.
  row.pipelined_ms =
      std::min(row.sequential_ms, std::max(row.comm_ms, row.optimizer_ms) + first_comm_ms);
  row.step_ms = rest_ms + row.pipelined_ms;
  const double one_rank_ms = rest_ms + fused_ms;
  row.efficiency = one_rank_ms / row.step_ms;
  row.speedup = static_cast<double>(ranks) * row.efficiency;
  return row;
}

std::string Mb(double bytes) { return Fixed(bytes / 1e6, 1); }

}  // namespace

void CheckDistributedOptions(const DoctorOptions& o) {
  for (int p : o.ranks) {
    if (p < 1 || p > kMaxPlanRanks) {
      Bad("ranks", "--ranks",
          "each must be 1.." + std::to_string(kMaxPlanRanks) + ", got " + std::to_string(p));
    }
  }
  if (o.zero && *o.zero != 0 && *o.zero != 1)
    Bad("zero", "--zero", "must be 0 or 1, got " + std::to_string(*o.zero));
  if (!std::isfinite(o.link_gbps) || !(o.link_gbps > 0.0))
    Bad("link_gbps", "--link-gbps", "must be a finite number > 0, got " + Num(o.link_gbps));
  if (!std::isfinite(o.link_latency_us) || !(o.link_latency_us >= 0.0)) {
    Bad("link_latency_us", "--link-latency-us",
        "must be a finite number >= 0, got " + Num(o.link_latency_us));
  }
  if (!(o.bucket_mb > 0.0 && o.bucket_mb <= kMaxBucketMiB)) {
    Bad("bucket_mb", "--bucket-mb",
        "must be a number of MiB > 0 and <= " + Num(kMaxBucketMiB) + ", got " + Num(o.bucket_mb));
  }
  // As DistributedOptimizer: ZeRO-1 shards would cut a whole-tensor sum.
  if (o.zero == 1 && !FusedFootprintOf(o).shardable) {
    Bad("zero", "--zero",
        o.optimizer + " sums over whole tensors, which ZeRO-1 shards would cut (use 0), got 1");
  }
}

std::vector<DistributedRow> PlanDistributed(const DoctorOptions& options, double fused_ms,
                                            double rest_ms) {
  CheckDistributedOptions(options);
  const FusedFootprint footprint = FusedFootprintOf(options);
  if (!std::isfinite(fused_ms) || !(fused_ms > 0.0))
    throw std::invalid_argument("distributed plan: fused_ms must be > 0, got " + Num(fused_ms));
  if (!std::isfinite(rest_ms) || !(rest_ms >= 0.0))
    throw std::invalid_argument("distributed plan: rest_ms must be >= 0, got " + Num(rest_ms));
  // The engine's own layout, every tensor in one group as the doctor's (groups move no bucket
  // edge).
  std::vector<TensorSpec> specs;
  for (std::size_t n : options.numels) specs.push_back({.numel = n});
  std::vector<DistributedRow> plan;
  for (int p : options.ranks) {
    const ShardLayout layout(specs, 1, p, BucketElements(options));
    for (int zero : {0, 1}) {
      if (options.zero ? *options.zero == zero : zero == 0 || footprint.shardable)
        plan.push_back(PlanOne(options, footprint, layout, zero, fused_ms, rest_ms));
    }
  }
  return plan;
}

void PrintDistributedPlan(std::ostream& out, const DoctorOptions& o,
                          const std::vector<DistributedRow>& plan) {
  out << "distributed plan (on paper): alpha-beta ring, " << Num(o.link_gbps) << " Gbit/s and "
      << Num(o.link_latency_us) << " us per hop, " << Num(o.bucket_mb)
      << " MiB f32 buckets; per rank and step, each rank at this step's batch\n";
  out << std::setw(6) << "P" << std::setw(6) << "zero" << std::setw(11) << "sent MB"
      << std::setw(11) << "memory MB" << std::setw(11) << "state MB" << std::setw(9) << "opt ms"
      << std::setw(10) << "comm ms" << std::setw(9) << "seq ms" << std::setw(9) << "pipe ms"
      << std::setw(10) << "step ms" << std::setw(9) << "speedup" << std::setw(7) << "eff %"
      << "\n";
  for (const DistributedRow& r : plan) {
    out << std::setw(6) << r.ranks << std::setw(6) << r.zero << std::setw(11) << Mb(r.bytes_sent)
        << std::setw(11) << Mb(r.memory_bytes) << std::setw(11) << Mb(r.state_bytes) << std::setw(9)
        << Fixed(r.optimizer_ms, 3) << std::setw(10) << Fixed(r.comm_ms, 3) << std::setw(9)
        << Fixed(r.sequential_ms, 3) << std::setw(9) << Fixed(r.pipelined_ms, 3) << std::setw(10)
        << Fixed(r.step_ms, 2) << std::setw(9) << Fixed(r.speedup, 1) << std::setw(7)
        << Fixed(100.0 * r.efficiency, 1) << "\n";
  }
  if (!o.zero && !FusedFootprintOf(o).shardable) {
    out << "(no zero=1 rows: " << o.optimizer
        << " sums over whole tensors, which ZeRO-1 shards would cut)\n";
  }
  out << "(opt: the fused step on the rank's elements; seq: comm + opt; pipe: bucket k's step "
         "overlapping bucket k+1's collectives; step: the rest of the step + pipe; speedup in "
         "samples/s vs 1 rank; docs/doctor.md)\n";
}

nlohmann::json DistributedJson(const std::vector<DistributedRow>& plan) {
  nlohmann::json rows = nlohmann::json::array();
  for (const DistributedRow& r : plan) {
    rows.push_back({{"ranks", r.ranks},
                    {"zero", r.zero},
                    {"buckets", r.buckets},
                    {"state_elements_per_rank", r.state_elements},
                    {"bytes_sent_per_rank", r.bytes_sent},
                    {"param_bytes_per_rank", r.param_bytes},
                    {"grad_bytes_per_rank", r.grad_bytes},
                    {"state_bytes_per_rank", r.state_bytes},
                    {"memory_bytes_per_rank", r.memory_bytes},
                    {"optimizer_ms", r.optimizer_ms},
                    {"comm_ms", r.comm_ms},
                    {"sequential_ms", r.sequential_ms},
                    {"pipelined_ms", r.pipelined_ms},
                    {"predicted_step_ms", r.step_ms},
                    {"speedup", r.speedup},
                    {"scaling_efficiency", r.efficiency}});
  }
  return rows;
}

nlohmann::json DistributedModelJson(const DoctorOptions& o) {
  return {{"link_gbps", o.link_gbps}, {"link_latency_us", o.link_latency_us},
          {"bucket_mb", o.bucket_mb}, {"bucket_elements", BucketElements(o)},
          {"grad_bytes", kGradBytes}, {"shard_multiple", kGrainElements}};
}

}  // namespace fusedopt::doctor
