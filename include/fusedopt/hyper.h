// Hyper-parameters of each optimizer, one struct per parameter group, with torch.optim's names and
// defaults (shared/docs/torch-semantics.md §2). The index of each algorithm's state buffers in
// Segment::state is given next to its struct, named after torch's state_dict keys.
#pragma once

namespace fusedopt {

// torch.optim.SGD. State: momentum_buffer (only when momentum != 0).
struct SgdHyper {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};
enum SgdState : int { kMomentumBuffer = 0 };

// torch.optim.Adam; with decoupled_weight_decay it is torch.optim.AdamW.
// State: exp_avg, exp_avg_sq, max_exp_avg_sq (only with amsgrad).
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled_weight_decay = false;
};
enum AdamState : int { kExpAvg = 0, kExpAvgSq = 1, kMaxExpAvgSq = 2 };

// torch.optim.AdamW: Adam with decoupled weight decay, whose default is 1e-2.
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  AdamHyper ToAdam() const {
    return {lr,           beta1,   beta2,    eps,
            weight_decay, amsgrad, maximize, /*decoupled_weight_decay=*/true};
  }
};

// torch.optim.RMSprop (eps outside the sqrt, as torch; not the TF variant).
// State: square_avg, momentum_buffer (momentum > 0), grad_avg (centered).
struct RmspropHyper {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;
};
enum RmspropState : int { kSquareAvg = 0, kRmspropMomentumBuffer = 1, kGradAvg = 2 };

// torch.optim.Adagrad. State: sum, which the caller fills with initial_accumulator_value before the
// first step (torch does so eagerly in the constructor; the Optimizer layer does it for you).
struct AdagradHyper {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  bool maximize = false;
};
enum AdagradState : int { kSum = 0 };

}  // namespace fusedopt
