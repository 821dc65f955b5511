#include "src/core/validate.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "fusedopt/error.h"

namespace fusedopt {
namespace {

// `!(x >= lo)` also rejects NaN.
void RequireAtLeast(std::string_view fn, std::size_t group, const char* name, double value,
                    double lo) {
  if (!(value >= lo))
    Fail(fn, "group ", group, ": invalid ", name, ": ", value, " (must be >= ", lo, ")");
}

void RequireBeta(std::string_view fn, std::size_t group, const char* name, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    Fail(fn, "group ", group, ": invalid ", name, ": ", value, " (must be in [0, 1))");
  }
}

}  // namespace

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void ValidateHyper(std::string_view fn, std::size_t group, const SgdHyper& h) {
  RequireAtLeast(fn, group, "lr", h.lr, 0.0);
  RequireAtLeast(fn, group, "momentum", h.momentum, 0.0);
  RequireAtLeast(fn, group, "weight_decay", h.weight_decay, 0.0);
  if (!std::isfinite(h.dampening)) Fail(fn, "group ", group, ": invalid dampening: ", h.dampening);
  if (h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0)) {
    Fail(fn, "group ", group,
         ": Nesterov momentum requires a momentum and zero dampening (momentum ", h.momentum,
         ", dampening ", h.dampening, ")");
  }
}

void ValidateHyper(std::string_view fn, std::size_t group, const AdamHyper& h) {
  RequireAtLeast(fn, group, "lr", h.lr, 0.0);
  RequireAtLeast(fn, group, "eps", h.eps, 0.0);
  RequireBeta(fn, group, "beta1", h.beta1);
  RequireBeta(fn, group, "beta2", h.beta2);
  RequireAtLeast(fn, group, "weight_decay", h.weight_decay, 0.0);
}

void ValidateHyper(std::string_view fn, std::size_t group, const RmspropHyper& h) {
  RequireAtLeast(fn, group, "lr", h.lr, 0.0);
  RequireAtLeast(fn, group, "eps", h.eps, 0.0);
  RequireAtLeast(fn, group, "momentum", h.momentum, 0.0);
  RequireAtLeast(fn, group, "weight_decay", h.weight_decay, 0.0);
  RequireAtLeast(fn, group, "alpha", h.alpha, 0.0);  // torch checks only alpha >= 0
}

void ValidateHyper(std::string_view fn, std::size_t group, const AdagradHyper& h) {
  RequireAtLeast(fn, group, "lr", h.lr, 0.0);
  RequireAtLeast(fn, group, "lr_decay", h.lr_decay, 0.0);
  RequireAtLeast(fn, group, "weight_decay", h.weight_decay, 0.0);
  RequireAtLeast(fn, group, "initial_accumulator_value", h.initial_accumulator_value, 0.0);
  RequireAtLeast(fn, group, "eps", h.eps, 0.0);
}

template <class Hyper>
void ValidateStep(std::string_view fn, std::span<const Hyper> groups,
                  std::span<const Segment> segments, const StateNames& state_names) {
  if (groups.empty() && !segments.empty())
    Fail(fn, "no groups given for ", segments.size(), " segments");
  for (std::size_t g = 0; g < groups.size(); ++g) ValidateHyper(fn, g, groups[g]);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.group >= groups.size()) {
      Fail(fn, "segment ", i, ": group ", s.group, " out of range (", groups.size(), " groups)");
    }
    for (DType t : {s.param_dtype, s.grad_dtype, s.state_dtype}) {
      if (!ValidDType(t)) Fail(fn, "segment ", i, ": invalid dtype code ", static_cast<int>(t));
    }
    if (s.master != nullptr && s.param_dtype == DType::kF32) {
      Fail(fn, "segment ", i, ": a master copy needs an f16 or bf16 param (param dtype is f32)");
    }
    if (s.step < 1) Fail(fn, "segment ", i, ": invalid step: ", s.step, " (must be >= 1)");
    if (!std::isfinite(s.grad_scale)) {
      Fail(fn, "segment ", i, ": invalid grad_scale: ", s.grad_scale, " (must be finite)");
    }
    if (s.stochastic_rounding &&
        s.global_offset > std::numeric_limits<std::uint64_t>::max() - s.numel) {
      Fail(fn, "segment ", i, ": invalid global_offset: ", s.global_offset,
           " (global_offset + numel = ", s.global_offset, " + ", s.numel, " exceeds 2^64 - 1)");
    }
    if (s.numel == 0) continue;
    if (s.param == nullptr) Fail(fn, "segment ", i, ": param is null but numel is ", s.numel);
    if (s.grad == nullptr) Fail(fn, "segment ", i, ": grad is null but numel is ", s.numel);
    const unsigned required = RequiredStates(groups[s.group]);
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if ((required >> slot & 1u) != 0 && s.state[slot] == nullptr) {
        Fail(fn, "segment ", i, ": state[", slot, "] (", state_names[slot],
             ") is null but numel is ", s.numel);
      }
    }
  }
}

template void ValidateStep(std::string_view, std::span<const SgdHyper>, std::span<const Segment>,
                           const StateNames&);
template void ValidateStep(std::string_view, std::span<const AdamHyper>, std::span<const Segment>,
                           const StateNames&);
template void ValidateStep(std::string_view, std::span<const RmspropHyper>,
                           std::span<const Segment>, const StateNames&);
template void ValidateStep(std::string_view, std::span<const AdagradHyper>,
                           std::span<const Segment>, const StateNames&);

}  // namespace fusedopt
