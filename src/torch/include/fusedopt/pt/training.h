// Training-loop helpers over torch tensors, for any torch::optim optimizer: gradient clipping run
// by the fused engine, and fusedopt::Schedule applied to param groups.
//
//   loss.backward();
//   fusedopt::pt::ClipGradNorm(model->parameters(), 1.0);  // torch::nn::utils::clip_grad_norm_
//   fusedopt::pt::ApplySchedule(opt, schedule, step);      // lr (and momentum) of step `step`
//   opt.step();
//
// The fusedopt::pt optimizers can also clip inside their step (optim.h: training().max_grad_norm),
// which saves the write of every gradient.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <span>
#include <vector>

#include "fusedopt/schedule.h"

namespace fusedopt::pt {

// torch::nn::utils::clip_grad_norm_: the norm_type-norm of all grads of `params` together (params
// whose grad is undefined are skipped), and every grad multiplied by
// min(1, max_norm / (norm + 1e-6)), computed in f32. Returns the norm. norm_type 1, 2 and inf on
// dense, contiguous CPU grads of dtype float32, float16 or bfloat16 run in the fused engine (one
// read for the norm, one read and write to scale, skipped when the factor is 1; the norm is
// accumulated in double, so for 16-bit grads it is more accurate than torch's, which rounds it to
// the grad dtype); any other norm_type or grad is handed to torch::nn::utils::clip_grad_norm_
// itself. A non-finite norm scales the grads by NaN or 0, as torch does; with error_if_nonfinite it
// is a TORCH_CHECK failure in torch's words instead, and no grad changes. max_norm must be >= 0.
double ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm, double norm_type = 2.0,
                    bool error_if_nonfinite = false);

// torch::nn::utils::clip_grad_value_: clamps every defined grad to [-clip_value, clip_value] in
// place (NaN stays NaN), in the engine for grads it takes (as above), with torch's clamp_
// otherwise. clip_value must be >= 0. Equal to torch's, except that for 16-bit grads and a
// clip_value that the grad dtype cannot represent, the engine clamps to f32(clip_value) and torch
// to the clip_value rounded to the grad dtype (an element between the two differs).
void ClipGradValue(const std::vector<at::Tensor>& params, double clip_value);

// Sets the lr of every param group of `optimizer` to schedule.Lr(step), the lr a torch loop that
// calls scheduler.step() after each optimizer.step() uses for its step `step` (0-based). When the
// schedule has momentum (OneCycleLr with cycle_momentum), it also sets SGD's and RMSprop's
// momentum and Adam's / AdamW's betas.first, as torch's OneCycleLR does; a group of another
// optimizer type then fails a TORCH_CHECK (before any group is changed).
void ApplySchedule(torch::optim::Optimizer& optimizer, const Schedule& schedule, std::int64_t step);

// As above with one schedule per param group (torch's schedulers keep each group's base lr):
// schedules.size() must equal the number of groups.
void ApplySchedule(torch::optim::Optimizer& optimizer, std::span<const Schedule> schedules,
                   std::int64_t step);

}  // namespace fusedopt::pt
