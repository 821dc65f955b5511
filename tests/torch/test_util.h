// Shared pieces of the adapter tests: a small deterministic "model" (params in two groups, sizes
// chosen to cover empty, odd and multi-chunk tensors), gradients that every optimizer under
// comparison receives identically, and the comparison metric.
#pragma once

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace fusedopt::pt::test {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs fn, which must throw c10::Error whose message contains every one of `parts`.
inline void ExpectTorchError(const std::function<void()>& fn,
                             std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "missing \"" << part << "\" in: " << message;
    }
    return;
  }
  ADD_FAILURE() << "no c10::Error thrown";
}

// Shapes of group 0 and group 1. 40000 elements span two of the core's 32768-element chunks; the
// empty tensor checks zero-size params.
inline std::vector<std::vector<std::vector<int64_t>>> GroupShapes() {
  return {{{7}, {33, 5}, {40000}}, {{64, 3}, {0}, {9}}};
}

using Params = std::vector<std::vector<torch::Tensor>>;  // [group][index]

// Fresh leaf params (requires_grad) with the same values for every call with the same seed.
inline Params MakeParams(std::uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  Params params;
  for (const auto& group : GroupShapes()) {
    params.emplace_back();
    for (const auto& shape : group) {
      params.back().push_back(torch::randn(shape).to(dtype).requires_grad_(true));
    }
  }
  return params;
}

// The values of t, in double.
inline std::vector<double> Doubles(const torch::Tensor& t) {
  const torch::Tensor d = t.detach().to(torch::kDouble).contiguous();
  const double* data = d.data_ptr<double>();
  return {data, data + d.numel()};
}

// The same states, bit for bit (tensors compared by value).
template <class State>
bool SameStates(const std::vector<std::unique_ptr<State>>& a,
                const std::vector<std::unique_ptr<State>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    if ((a[k] == nullptr) != (b[k] == nullptr)) return false;
    if (a[k] != nullptr && !(*a[k] == *b[k])) return false;
  }
  return true;
}

// Deep copy (new storage, same values): the same model for a second optimizer.
inline Params CloneParams(const Params& params) {
  Params out;
  for (const auto& group : params) {
    out.emplace_back();
    for (const auto& p : group) out.back().push_back(p.detach().clone().requires_grad_(true));
  }
  return out;
}

// Whether param `flat` (index over all groups) has a grad at step t: each param misses some steps,
// at different times, so per-param step counts diverge (torch skips params whose grad is
// undefined).
inline bool HasGrad(int t, int flat) { return (t + flat) % 4 != 3; }

// Sets the grads of step t on one model: random values drawn from (t, param) only, so every model
// gets the same grads; undefined where HasGrad is false.
inline void SetGrads(const Params& params, int t) {
  int flat = 0;
  for (const auto& group : params) {
    for (const auto& p : group) {
      if (HasGrad(t, flat)) {
        torch::manual_seed(static_cast<std::uint64_t>(1000 * t + flat));
        p.mutable_grad() = (torch::randn(p.sizes()) * (0.5 + flat % 3)).to(p.scalar_type());
      } else {
        p.mutable_grad() = torch::Tensor();
      }
      ++flat;
    }
  }
}

// Param groups for an optimizer whose options type is Options: group 0 gets `group0`, group 1 the
// same with its lr scaled by lr_scale (different lrs per group, as schedulers produce).
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> MakeGroups(const Params& params,
                                                          const Options& group0,
                                                          double lr_scale = 0.3) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  Options group1 = group0;
  group1.lr(group0.lr() * lr_scale);
  groups.emplace_back(params[0], std::make_unique<Options>(group0));
  groups.emplace_back(params[1], std::make_unique<Options>(group1));
  return groups;
}

// The largest difference between two models, relative to |reference| but never to less than
// kFloorFraction of the tensor's largest magnitude: a param that crosses zero carries the absolute
// rounding error of the updates it received, which would otherwise look arbitrarily large.
inline constexpr double kFloorFraction = 1e-2;

struct Difference {
  double max_rel = 0.0;
  std::string worst;  // where max_rel occurs, for failure messages
};

inline void Accumulate(const torch::Tensor& actual, const torch::Tensor& reference,
                       const std::string& name, Difference& diff) {
  if (reference.numel() == 0) return;
  const torch::Tensor a = actual.detach().to(torch::kDouble).flatten();
  const torch::Tensor r = reference.detach().to(torch::kDouble).flatten();
  const double scale = r.abs().max().item<double>();
  const double floor = std::max(kFloorFraction * scale, 1e-30);
  const torch::Tensor rel = (a - r).abs() / r.abs().clamp_min(floor);
  const std::int64_t at = rel.argmax().item<std::int64_t>();
  const double worst = rel[at].item<double>();
  if (worst > diff.max_rel || (diff.worst.empty() && worst == diff.max_rel)) {
    diff.max_rel = worst;
    diff.worst = name + "[" + std::to_string(at) + "]: " + std::to_string(a[at].item<double>()) +
                 " vs reference " + std::to_string(r[at].item<double>()) + " (max |reference| " +
                 std::to_string(scale) + ")";
  }
}

inline Difference Compare(const Params& actual, const Params& reference) {
  Difference diff;
  for (std::size_t g = 0; g < actual.size(); ++g) {
    for (std::size_t i = 0; i < actual[g].size(); ++i) {
      Accumulate(actual[g][i], reference[g][i],
                 "param_groups[" + std::to_string(g) + "].params[" + std::to_string(i) + "]", diff);
    }
  }
  return diff;
}

inline double MaxRelDiff(const Params& actual, const Params& reference) {
  return Compare(actual, reference).max_rel;
}

// EXPECTs max_rel <= tolerance, printing the worst element otherwise.
inline void ExpectClose(const Params& actual, const Params& reference, double tolerance) {
  const Difference diff = Compare(actual, reference);
  EXPECT_LE(diff.max_rel, tolerance) << "worst element: " << diff.worst;
}

// EXPECTs, per tensor, max|a - r| <= tolerance * max|r|: a difference measured in units of the
// tensor's scale. For 16-bit params, where every step rounds each param to the storage type, a
// param's error is a few ulps at the magnitudes it passed through, not at its final value.
inline void ExpectCloseNormwise(const Params& actual, const Params& reference, double tolerance) {
  for (std::size_t g = 0; g < actual.size(); ++g) {
    for (std::size_t i = 0; i < actual[g].size(); ++i) {
      if (reference[g][i].numel() == 0) continue;
      const torch::Tensor a = actual[g][i].detach().to(torch::kDouble);
      const torch::Tensor r = reference[g][i].detach().to(torch::kDouble);
      const double diff = (a - r).abs().max().item<double>();
      const double scale = r.abs().max().item<double>();
      EXPECT_LE(diff, tolerance * scale)
          << "param_groups[" << g << "].params[" << i << "]: max |difference| " << diff
          << ", max |reference| " << scale;
    }
  }
}

inline bool BitwiseEqual(const Params& a, const Params& b) {
  for (std::size_t g = 0; g < a.size(); ++g) {
    for (std::size_t i = 0; i < a[g].size(); ++i) {
      if (!torch::equal(a[g][i].detach(), b[g][i].detach())) return false;
    }
  }
  return true;
}

// Steps [from, to) of both runs on the same grads: their params then equal bit for bit.
template <class Optimizer>
void StepBothAlike(Optimizer& original, const Params& params, Optimizer& loaded,
                   const Params& loaded_params, int from, int to) {
  for (int t = from; t < to; ++t) {
    SetGrads(params, t);
    SetGrads(loaded_params, t);
    original.step();
    loaded.step();
  }
  EXPECT_TRUE(BitwiseEqual(loaded_params, params))
      << "max rel diff " << MaxRelDiff(loaded_params, params);
}

}  // namespace fusedopt::pt::test
