// fusedopt/pt/training.h: clipping over torch grads through fusedopt's GradBuffer passes, and
// schedules applied to torch param groups.

#include "fusedopt/pt/training.h"

#include <c10/util/Exception.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "src/torch/tensor_checks.h"

namespace fusedopt::pt {
namespace {

// A grad the engine can read and write in place as one flat buffer.
bool EngineGrad(const at::Tensor& grad) {
  const auto type = grad.scalar_type();
  return grad.device().is_cpu() && grad.layout() == at::kStrided && grad.is_contiguous() &&
         (type == at::kFloat || type == at::kHalf || type == at::kBFloat16);
}

// The grads of `params` as buffers, or nullopt when some defined grad is not an engine grad.
std::optional<std::vector<GradBuffer>> EngineBuffers(const std::vector<at::Tensor>& params) {
  std::vector<GradBuffer> buffers;
  for (const at::Tensor& p : params) {
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    if (!EngineGrad(grad)) return std::nullopt;
    buffers.push_back(
        {grad.data_ptr(), static_cast<std::size_t>(grad.numel()), detail::ToDType(grad)});
  }
  return buffers;
}

}  // namespace

double ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm, double norm_type,
                    bool error_if_nonfinite) {
  TORCH_CHECK(max_norm >= 0.0, "fusedopt::pt::ClipGradNorm: invalid max_norm ", max_norm,
              " (must be >= 0)");
  std::optional<NormType> type;
  if (norm_type == 1.0) type = NormType::kL1;
  if (norm_type == 2.0) type = NormType::kL2;
  if (norm_type == std::numeric_limits<double>::infinity()) type = NormType::kInf;
  std::optional<std::vector<GradBuffer>> buffers;
  if (type.has_value()) buffers = EngineBuffers(params);
  if (!buffers.has_value()) {
    return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite);
  }
  if (buffers->empty()) return 0.0;  // torch: no param with a grad

  // As torch, which scales grad.data(): the grads' version counters are not bumped.
  double norm = 0.0;
  try {
    norm = fusedopt::ClipGradNorm(*buffers, max_norm, *type, error_if_nonfinite);
  } catch (const fusedopt::Error& e) {
    // The arguments were checked above: the core rejects only a non-finite norm here, with no grad
    // changed. torch's words:
    TORCH_CHECK(!error_if_nonfinite, "The total norm of order ", norm_type,
                " for gradients from `parameters` ",
                "is non-finite, so it cannot be clipped. To disable this error and scale ",
                "the gradients with the non-finite norm anyway, set ",
                "`error_if_nonfinite=false`");
    TORCH_CHECK(false, "fusedopt::pt::ClipGradNorm: ", e.what());
  }
  return norm;
}

void ClipGradValue(const std::vector<at::Tensor>& params, double clip_value) {
  TORCH_CHECK(clip_value >= 0.0, "fusedopt::pt::ClipGradValue: invalid clip_value ", clip_value,
              " (must be >= 0)");
  const std::optional<std::vector<GradBuffer>> buffers = EngineBuffers(params);
  if (!buffers.has_value()) {
    torch::nn::utils::clip_grad_value_(params, clip_value);
    return;
  }
  try {
    fusedopt::ClipGradValue(*buffers, clip_value);
  } catch (const fusedopt::Error& e) {
    TORCH_CHECK(false, "fusedopt::pt::ClipGradValue: ", e.what());
  }
}

namespace {

// Sets the momentum of SGD / RMSprop options, or beta1 of Adam / AdamW options.
void SetMomentum(torch::optim::OptimizerOptions& options, double momentum) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    sgd->momentum(momentum);
  } else if (auto* rmsprop = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    rmsprop->momentum(momentum);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas({momentum, std::get<1>(adam->betas())});
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    adamw->betas({momentum, std::get<1>(adamw->betas())});
  }
}

bool HasMomentum(const torch::optim::OptimizerOptions& options) {
  return dynamic_cast<const torch::optim::SGDOptions*>(&options) != nullptr ||
         dynamic_cast<const torch::optim::RMSpropOptions*>(&options) != nullptr ||
         dynamic_cast<const torch::optim::AdamOptions*>(&options) != nullptr ||
         dynamic_cast<const torch::optim::AdamWOptions*>(&options) != nullptr;
}

}  // namespace

void ApplySchedule(torch::optim::Optimizer& optimizer, std::span<const Schedule> schedules,
                   std::int64_t step) {
  auto& groups = optimizer.param_groups();
  TORCH_CHECK(schedules.size() == groups.size(), "fusedopt::pt::ApplySchedule: ", schedules.size(),
              " schedules for ", groups.size(), " param groups");
  // Evaluate everything first, so that a failure (a Schedule's fusedopt::Error, a group without
  // momentum) changes no group.
  std::vector<std::pair<double, std::optional<double>>> values;
  values.reserve(groups.size());
  try {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::optional<double> momentum;
      if (schedules[g].has_momentum()) {
        TORCH_CHECK(HasMomentum(groups[g].options()), "fusedopt::pt::ApplySchedule: param_groups[",
                    g, "]: the schedule ", schedules[g].Describe(),
                    " sets momentum, which this group's options (not SGD, Adam, AdamW or RMSprop) "
                    "do not have");
        momentum = schedules[g].Momentum(step);
      }
      values.emplace_back(schedules[g].Lr(step), momentum);
    }
  } catch (const fusedopt::Error& e) {
    TORCH_CHECK(false, "fusedopt::pt::ApplySchedule: ", e.what());
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].options().set_lr(values[g].first);
    if (values[g].second.has_value()) SetMomentum(groups[g].options(), *values[g].second);
  }
}

void ApplySchedule(torch::optim::Optimizer& optimizer, const Schedule& schedule,
                   std::int64_t step) {
  const std::vector<Schedule> schedules(optimizer.param_groups().size(), schedule);
  ApplySchedule(optimizer, schedules, step);
}

}  // namespace fusedopt::pt
