// Checkpoints of a libtorch run in the one checkpoint format (fusedopt/checkpoint.h,
// docs/checkpoints.md): the optimizer's param_groups and state under torch's flattened names
// (state.<i>.exp_avg, ...), the model's parameters and buffers (model.<name>, as Python's
// state_dict names them), the loss scaler's state and a training loop's counters. A file written
// here loads in Python with fusedopt.load_checkpoint into the twin classes (FusedAdamW,
// torch.optim.AdamW, ...) and a model of the same structure, and a Python file loads here.
//
//   fusedopt::pt::SaveCheckpoint(optimizer, "ckpt/step-100.safetensors",
//                                {.model = model.get(), .scaler = &scaler, .counters = {...}});
//   fusedopt::pt::LoadCheckpoint(optimizer, path, {.model = model.get(), .scaler = &scaler});
//
// The optimizer is a fusedopt::pt class or a torch::optim SGD, Adam, AdamW, RMSprop or Adagrad
// (whose state the fused twins share). Loading checks everything first — the file, the algorithm,
// the layout (param groups, each param's shape and dtype), the model's names, shapes and dtypes,
// the hyper-parameters — and throws fusedopt::CheckpointError saying what differs, with the
// optimizer, model and scaler as they were. Loaded states take their param's dtype (as torch's
// load_state_dict casts them); an f32 master copy in a Python file (master_weights=True) has no
// place here and is not loaded.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "fusedopt/checkpoint.h"
#include "fusedopt/scaler.h"

namespace fusedopt::pt {

struct CheckpointParts {
  torch::nn::Module* model = nullptr;  // its parameters and buffers, when given
  LossScaler* scaler = nullptr;        // its scale and growth tracker, when given
  CheckpointCounters counters = {};    // saved; LoadCheckpoint returns the file's
};

// Throws std::invalid_argument for an optimizer of another class, std::system_error for a failed
// write (the previous file at `path` stays whole).
void SaveCheckpoint(const torch::optim::Optimizer& optimizer, const std::string& path,
                    const CheckpointParts& parts = {});
// Restores what SaveCheckpoint (or fusedopt.save_checkpoint) wrote into the optimizer and the
// parts given (the file must hold each of them); returns the saved counters.
CheckpointCounters LoadCheckpoint(torch::optim::Optimizer& optimizer, const std::string& path,
                                  const CheckpointParts& parts = {});

}  // namespace fusedopt::pt
