// fusedopt::pt: libtorch optimizers whose step() is one fused fusedopt pass over every parameter.
//
// Each class is a drop-in for its torch::optim namesake: it *is* that class (public subclass), so
// it takes the same options type (torch::optim::AdamOptions, ...), the same param groups, and keeps
// torch's param-state classes (AdamParamState, ...) in state(). Construction checks,
// add_param_group, zero_grad, serialize / torch::save / torch::load are torch's own, which makes
// saved optimizers interchangeable in both directions. Only step() differs: instead of a loop of
// ATen ops per tensor, it hands every param with a defined grad, over all groups, to one
// fusedopt::<Algo>Step call.
//
//   fusedopt::pt::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   loss.backward();
//   opt.step();
//
// Requirements on stepped params (checked with TORCH_CHECK before anything is written; the message
// names the param as param_groups[g].params[i]): CPU, strided and contiguous, dtype float32,
// float16 or bfloat16, a dense grad of the same shape (also float32/float16/bfloat16), no param
// given twice. State tensors are kept in the param's dtype, as torch does. Params whose grad is
// undefined are skipped: no state, no step count, untouched.
//
// The step runs on fusedopt::DefaultRuntime(): OMP_NUM_THREADS threads, or one per core
// (fusedopt::DefaultRuntime().set_num_threads(n) changes it); results do not depend on the count.
//
// Numerics follow torch.optim 2.x's single-tensor Python code (Adam/AdamW/RMSprop use lerp_ for the
// running means where libtorch's C++ loop uses mul_+add_), so results agree with torch::optim
// within a few f32 ulps per step, and SGD agrees bit for bit on FMA machines. torch::optim's
// options have no `maximize` flag; neither do these classes.
#pragma once

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace fusedopt::pt {

// SGD with momentum, dampening, Nesterov and weight decay. State: SGDParamState::momentum_buffer,
// created on a param's first step (a copy of its update direction) when momentum != 0.
class SGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// Adam (L2 weight decay added to the gradient), optionally AMSGrad. State: AdamParamState.
class Adam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// AdamW (decoupled weight decay, default 1e-2), optionally AMSGrad. State: AdamWParamState.
class AdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// RMSprop (eps outside the square root), optionally centered and with momentum.
// State: RMSpropParamState.
class RMSprop : public torch::optim::RMSprop {
 public:
  using torch::optim::RMSprop::RMSprop;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// Adagrad with lr_decay and weight decay. As torch's, the constructor creates every param's state
// with sum = initial_accumulator_value (the defaults' value); a param added later with
// add_param_group gets its state on its first step, from its group's value.
class Adagrad : public torch::optim::Adagrad {
 public:
  using torch::optim::Adagrad::Adagrad;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fusedopt::pt
