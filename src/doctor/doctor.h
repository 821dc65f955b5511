// `fusedopt doctor`: is the optimizer worth fusing in *this* training run? From the measured step
// time and the standard optimizer's share of it (given, read from a `--trace`, or timed here), it
// counts the elementary ops and memory passes a for-loop torch.optim step issues for the model's
// tensor shapes vs fusedopt's one pass, times the fused step and the bandwidth ceiling
// (same_traffic) on buffers of exactly those shapes, and predicts the end-to-end speedup with
// Amdahl's law: the seeds' troubleshooting section made executable. docs/doctor.md has the model.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace fusedopt::doctor {

struct DoctorOptions {
  // A descriptor's kName (src/tool_util/algorithm.h: AlgorithmNames lists the registry's).
  std::string optimizer = "adamw";
  std::vector<std::size_t> numels;  // element count of every parameter tensor, optimizer order
  std::string dtype = "f32";        // params, grads and states (as torch keeps them)
  // NaN: the reference's default for the optimizer (its Hyper struct's; 0 where it has none).
  double weight_decay = std::numeric_limits<double>::quiet_NaN();
  double momentum = 0.0;       // sgd and rmsprop
  bool nesterov = false;       // sgd
  std::optional<double> clip;  // clip_grad_norm_(max_norm) before the step; unset: no clipping
  double step_ms = 0.0;        // the measured training step (median), > 0
  // The standard optimizer's time within that step; unset: timed here (src/baselines/standard.cc).
  std::optional<double> optimizer_ms;
  int threads = 0;  // 0: OpenMP's default
  int rounds = 15;

  // Filled by DoctorOptionsFromTrace; the defaults describe numbers typed on the command line.
  std::string impl;                           // the traced implementation diagnosed; empty: none
  std::string optimizer_ms_source = "given";  // "given" or "trace" ("measured" when unset)
  // The same trace's fused run (impl `fused`), when it has one: its median step, for comparison.
  std::optional<double> trace_fused_step_ms;

  // The distributed plan (src/doctor/distributed_plan.h): per-rank bytes, memory and step time
  // predicted at each of these world sizes (1..1024) from the single-rank numbers; empty: no plan.
  std::vector<int> ranks;
  std::optional<int> zero;       // 0: data parallel, 1: ZeRO-1; unset: both
  double link_gbps = 100.0;      // β: each rank's link, Gbit/s
  double link_latency_us = 5.0;  // α: per ring hop
  double bucket_mb = 25.0;       // MiB of f32 gradients per collective (DDP's default)
};

// Work of one optimizer step over all tensors.
struct OpCount {
  std::size_t ops = 0;  // elementary op launches (kernels), scalar bookkeeping included
  // Full-tensor memory sweeps: bytes / (total numel × element size), i.e. how many times the step
  // reads or writes a tensor of the model's size (param r+w = 2 passes).
  double passes = 0.0;
  std::size_t bytes = 0;  // bytes read plus bytes written
};

// The reference's single-tensor (for-loop, foreach=False) step in steady state (not the first
// step), as its descriptor's StandardStep writes it (src/algos/descriptor.h; the step
// src/baselines/standard.cc times), with clip_grad_norm_ before it when options.clip is set. Each
// op is one launch and moves (distinct tensors read + tensors written) × numel × element size; a
// norm reads its tensor and writes nothing. Throws std::invalid_argument for an unknown optimizer
// or dtype, no tensors, a zero numel or a clip that is not > 0.
OpCount CountStandardOps(const DoctorOptions& options);

// fusedopt: one fused pass over all tensors (param r+w, grad read, each state r+w; the bytes
// `fusedopt bench` reports as bytes_per_param × numel), for a two-phase step (LAMB) preceded by its
// reduction pass (one more op reading the param, the grad and each state), plus, with clip, the
// read-only pre-pass over the grads (one more op and one more grad read).
OpCount CountFusedOps(const DoctorOptions& options);

// What the fused step holds per parameter element: the param, its grad and each optimizer state
// the step keeps under these hyper-parameters, all in the param dtype (as FlatStorage allocates
// them and CountFusedOps counts them; factored states count as full vectors, as the doctor's
// tensors are). Validates the options as CountFusedOps does.
struct FusedFootprint {
  std::size_t numel = 0;  // all tensors together
  std::size_t param = 0;  // bytes per element
  std::size_t grad = 0;
  std::size_t state = 0;  // all states together
  // ZeRO-1 can shard the step (tools::ShardsWithZeroOne, the engine's own rule: an update that
  // reads only its own element, or whose whole-tensor sums the shards add up).
  bool shardable = true;
};
FusedFootprint FusedFootprintOf(const DoctorOptions& options);

// Validates the options, times fused, same_traffic (and standard, if optimizer_ms is unset) on
// buffers of those shapes, interleaved, medians of `rounds`; prints the report (a table and the
// verdict in plain language) to `report` and progress to `progress`; returns the JSON report.
// With `ranks`, the distributed plan follows (a table, and the JSON's "distributed" array).
// Throws std::invalid_argument naming the field and the value for bad options.
nlohmann::json Diagnose(const DoctorOptions& options, std::ostream& report, std::ostream& progress);

// Reads a training timeline (docs/trace-format.md). Diagnoses the standard implementation (`torch`,
// else `foreach`, else `torch_fused`; a run with only `fused` is diagnosed as already fused):
// step_ms and optimizer_ms are the medians of its non-warm-up `step` spans and of the `optimizer`
// spans of those steps. Throws std::invalid_argument naming what is missing or malformed.
DoctorOptions DoctorOptionsFromTrace(const nlohmann::json& trace);

}  // namespace fusedopt::doctor
