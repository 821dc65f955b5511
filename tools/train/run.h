// `fusedopt train`: a real libtorch training loop on one of the models of models.h, with
// torch::optim (`torch`) or fusedopt::pt (`fused`) optimizers; with several impls (--compare), each
// trains its own copy of one initialization on the same batches, step by step in turn, so that the
// machine's noise hits them alike. Reports the seeds' table (throughput, optimizer time and share,
// training time, speedup, the Amdahl bound), as text, Markdown and JSON, plus a timeline.
#pragma once

#include <torch/optim/optimizer.h>

#include <iosfwd>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "tools/train/models.h"
#include "tools/train/report.h"  // MarkdownTable

namespace fusedopt::train {

struct TrainOptions {
  ModelConfig model;
  DataConfig data;
  std::string optimizer =
      "adamw";  // adamw, adam, sgd (momentum), rmsprop, adagrad, OtherOptimizers()
  // Unset: the optimizer's default here (adamw 1e-3 / wd 1e-2; sgd 0.01, momentum 0.9, wd 1e-4;
  // adam 1e-3; rmsprop 1e-3; adagrad 1e-2). Set: a finite number >= 0 (NaN is an error).
  std::optional<double> lr;
  std::optional<double> weight_decay;
  double momentum = 0.9;                       // sgd
  bool nesterov = false;                       // sgd
  std::vector<std::string> impls = {"fused"};  // torch and/or fused
  int steps = 30;                              // timed optimizer updates per impl
  int warmup = 3;                              // untimed updates first
  int threads = 0;                             // 0: the default (OMP_NUM_THREADS or one per core)
  std::string dtype = "f32";  // f32, or bf16 (CPU autocast; params and optimizer stay f32)
  // The fused impl's optimizer states: f32, bf16, or q8 (8-bit block-wise, the element-wise
  // algorithms); the torch impl's stay f32.
  std::string state_dtype = "f32";
  int accumulation_steps = 1;
  double max_grad_norm = std::numeric_limits<double>::infinity();
  int lr_warmup = 0;       // > 0: linear warmup over that many updates, then cosine to 0.01 lr
  bool schedule = false;   // warmup + cosine (lr_warmup, total = warmup + steps)
  std::string trace_path;  // Chrome trace JSON, written (checked, atomically) at the end of a run
  bool progress = true;    // a progress bar on the progress stream
  bool predict = true;     // run the doctor on the torch impl's numbers (with torch and fused)
  // One impl only: checkpoints every checkpoint_every updates into checkpoint_dir, keeping the
  // newest keep_last (0: all); resume continues from the newest that verifies (the same batches
  // follow as in an uninterrupted run, which it matches bit for bit). With --dist each checkpoint
  // is a shard set (every rank writes its file).
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  int keep_last = 0;
  bool resume = false;
};

// Trains, prints the table to `out` and progress to `progress`, returns the JSON report:
// {"model", "optimizer", ..., "impls": {"torch": {"label", "samples_per_s", "step_ms",
//  "optimizer_ms", "optimizer_share", "total_s", "phases_ms": {...}, "losses": [...]}, "fused":
//  ...}, and with both impls "speedup", "amdahl_bound", "bound_gain_captured",
//  "max_loss_rel_diff_first10", "doctor": {...}}. Throws std::invalid_argument naming a bad option
//  and its value.
nlohmann::json RunTraining(const TrainOptions& options, std::ostream& out, std::ostream& progress);

// The --optimizer choices without a torch::optim class (the registry's other kNames, comma-
// separated): the fused impl is fusedopt::pt's class, the torch impl the reference's for-loop step
// in ATen ops.
std::string OtherOptimizers();

// The optimizer's hyper-parameters: the options' values, else the optimizer's defaults here.
// Throws std::invalid_argument for an unknown optimizer or a weight decay it does not have.
struct ResolvedHyper {
  double lr, weight_decay, momentum;
  bool nesterov;
};
ResolvedHyper ResolveHyper(const TrainOptions& options);

// Throws std::invalid_argument for --checkpoint-every, --resume or --keep-last values that make no
// sense (a negative count, a checkpoint option without --checkpoint-dir).
void ValidateCheckpointOptions(const TrainOptions& options);

// --state-dtype as the engine's dtype; throws std::invalid_argument for a value other than f32,
// bf16 and q8, and for q8 with an optimizer whose step reads whole tensors (LAMB, ...).
DType StateDType(const TrainOptions& options);
// A fusedopt::pt optimizer's training().state_dtype for the engine's dtype.
void SetStateDType(torch::optim::Optimizer& fused, DType state_dtype);

// torch::optim's class or the reference's for-loop (fused false: impl "torch"), or fusedopt::pt's
// class (impl "fused"), over `params`.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::string& name, bool fused,
                                                       const std::vector<torch::Tensor>& params,
                                                       const ResolvedHyper& h);

// `fusedopt train --dist`, under mpirun: data-parallel training with the fused optimizer folded
// into the gradient reduction (fusedopt::DistributedOptimizer). Every rank builds the model and
// takes its 1/P slice of each global batch (the same batches, in the same order, as a one-process
// run); rank 0 prints the table and returns the report, the other ranks null. Throws
// std::invalid_argument naming an option it cannot take with --dist.
struct DistTrainOptions {
  int zero = 0;             // 0: data parallel; 1: ZeRO-1
  double bucket_mb = 25.0;  // gradient MiB per bucket
  // Rank 0 also trains a one-process copy (fusedopt::pt, the whole batch) and reports how far the
  // losses are from it.
  bool reference = false;
};
nlohmann::json RunDistributedTraining(const TrainOptions& options, const DistTrainOptions& dist,
                                      std::ostream& out, std::ostream& progress);

}  // namespace fusedopt::train
