#include "src/doctor/checks.h"

#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

#include "fusedopt/runtime.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using baselines::BenchHyper;
using baselines::BenchRequiredStates;
using tools::Algorithm;
using tools::AlgorithmNames;
using tools::AlgorithmOf;
using tools::CheckedAdd;
using tools::CheckedMul;
using tools::CheckFitsInMemory;
using tools::Num;
using tools::ParseAlgorithm;
using tools::WithDescriptor;

[[noreturn]] void Bad(const std::string& field, const std::string& option,
                      const std::string& what) {
  throw std::invalid_argument(field + " (" + option + "): " + what);
}

namespace {

Algorithm CheckedAlgorithm(const DoctorOptions& o) {
  Algorithm a{};
  try {
    a = ParseAlgorithm(o.optimizer);
  } catch (const std::invalid_argument&) {
    Bad("optimizer", "--optimizer",
        "unknown optimizer '" + o.optimizer + "'; known: " + AlgorithmNames());
  }
  return a;
}

DType CheckedDType(const DoctorOptions& o) {
  DType dtype = DType::kF32;
  if (!ParseDType(o.dtype, &dtype))
    Bad("dtype", "--dtype", "unknown dtype '" + o.dtype + "'; known: f32, bf16, f16");
  return dtype;
}

// The reference's default weight decay when none is given (NaN): the Hyper struct's (e.g. AdamW's
// 1e-2), or 0 for an algorithm that has none.
double EffectiveWeightDecay(const DoctorOptions& o, Algorithm a) {
  if (!std::isnan(o.weight_decay)) return o.weight_decay;
  return WithDescriptor(a, [](auto d) -> double {
    using Hyper = typename decltype(d)::type::Hyper;
    if constexpr (requires(Hyper h) { h.weight_decay; }) {
      return Hyper{}.weight_decay;
    } else {
      return 0.0;
    }
  });
}

}  // namespace

Model CheckedModel(const DoctorOptions& o) {
  const Algorithm a = CheckedAlgorithm(o);
  const DType dtype = CheckedDType(o);
  const double wd = EffectiveWeightDecay(o, a);
  if (!std::isfinite(wd) || wd < 0.0)
    Bad("weight_decay", "--weight-decay", "must be a finite number >= 0, got " + Num(wd));
  if (!std::isfinite(o.momentum) || o.momentum < 0.0)
    Bad("momentum", "--momentum", "must be a finite number >= 0, got " + Num(o.momentum));
  const Algorithm sgd = AlgorithmOf<algos::Sgd>();
  if (o.momentum != 0.0 && a != sgd && a != AlgorithmOf<algos::Rmsprop>())
    Bad("momentum", "--momentum", "applies to sgd and rmsprop only, got " + Num(o.momentum));
  if (o.nesterov && (a != sgd || o.momentum <= 0.0))
    Bad("nesterov", "--nesterov", "needs --optimizer sgd and --momentum > 0 (as torch.optim.SGD)");
  if (o.clip && (!std::isfinite(*o.clip) || !(*o.clip > 0.0)))
    Bad("clip", "--clip", "invalid max norm '" + Num(*o.clip) + "' (a finite number > 0)");
  if (o.numels.empty()) Bad("numels", kNumelsSource, "no parameter tensors given");
  std::size_t numel = 0;
  for (std::size_t i = 0; i < o.numels.size(); ++i) {
    if (o.numels[i] == 0)
      Bad("numels", kNumelsSource, "tensor " + std::to_string(i) + " has 0 elements");
    numel = CheckedAdd(numel, o.numels[i], "numels (" + std::string(kNumelsSource) + "): the sum");
  }
  return {a, dtype, wd, o.numels.size(), numel};
}

BenchHyper MakeHyper(const Model& m, const DoctorOptions& o) {
  BenchHyper h;
  h.Of<SgdHyper>() = {.lr = 1e-3};
  algos::All::ForEach([&](auto d) {
    auto& hyper = h.Of<typename decltype(d)::type::Hyper>();
    if constexpr (requires { hyper.weight_decay; }) hyper.weight_decay = m.weight_decay;
    if constexpr (requires { hyper.momentum; }) hyper.momentum = o.momentum;
    if constexpr (requires { hyper.nesterov; }) hyper.nesterov = o.nesterov;
  });
  return h;
}

std::size_t FusedStates(const Model& m, const DoctorOptions& o) {
  return static_cast<std::size_t>(std::popcount(BenchRequiredStates(m.algorithm, MakeHyper(m, o))));
}

void CheckBuffersFit(const Model& m, const DoctorOptions& o) {
  const FusedFootprint b = FusedFootprintOf(o);
  const std::string what = "numels (" + std::string(kNumelsSource) +
                           "): " + std::to_string(m.numel) + " elements of " + o.dtype;
  CheckFitsInMemory(CheckedMul(m.numel, b.param + b.grad + b.state, what), what);
}

void CheckStepOptions(const DoctorOptions& o) {
  if (!std::isfinite(o.step_ms) || !(o.step_ms > 0.0))
    Bad("step_ms", "--step-ms", "must be a finite number > 0, got " + Num(o.step_ms));
  if (o.optimizer_ms) {
    if (!std::isfinite(*o.optimizer_ms) || !(*o.optimizer_ms > 0.0))
      Bad("optimizer_ms", "--optimizer-ms",
          "must be a finite number > 0, got " + Num(*o.optimizer_ms));
    if (*o.optimizer_ms >= o.step_ms)
      Bad("optimizer_ms", "--optimizer-ms",
          "must be less than step_ms " + Num(o.step_ms) + ", got " + Num(*o.optimizer_ms));
  }
  if (o.threads < 0 || o.threads > kMaxThreads) {
    Bad("threads", "--threads",
        "must be 0.." + std::to_string(kMaxThreads) + ", got " + std::to_string(o.threads));
  }
  if (o.rounds < 1) Bad("rounds", "--rounds", "must be >= 1, got " + std::to_string(o.rounds));
}

}  // namespace fusedopt::doctor
