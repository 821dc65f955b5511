// The fusedopt::pt optimizers: how each maps its options and param state (torch::optim's, our own
// for Lion and LAMB, the generic HyperOptions / HyperParamState for the others) onto the core's
// hyper struct and Segment::state slots (the loop itself is fused_step.h; state keys, fields and
// initial values come from the algorithm's descriptor, src/algos/). Also the option and state
// classes of Lion and LAMB, written as libtorch writes Adam's, and the generic ones, written from
// the descriptors' field and state lists.

#include "fusedopt/pt/optim.h"

#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "src/torch/fused_step.h"
#include "src/torch/optim_traits.h"

namespace fusedopt::pt {
namespace {

using detail::AdagradTraits;
using detail::AdamTraits;
using detail::AdamWTraits;
using detail::CheckLambMaxGradNorm;
using detail::GenericName;
using detail::GenericTraits;
using detail::kInf;
using detail::LambTraits;
using detail::LionTraits;
using detail::RmspropTraits;
using detail::SgdTraits;

// libtorch 2.13's rule for a param group given its own options (its optimizers'
// _merge_by_comparison): a field that differs from its constructor default is the group's, the
// others come from the optimizer's defaults.
LionOptions Merged(const LionOptions& group, const LionOptions& defaults) {
  const LionOptions fresh;
  LionOptions merged = defaults;
  if (group.lr() != fresh.lr()) merged.lr(group.lr());
  if (group.betas() != fresh.betas()) merged.betas(group.betas());
  if (group.weight_decay() != fresh.weight_decay()) merged.weight_decay(group.weight_decay());
  return merged;
}

LambOptions Merged(const LambOptions& group, const LambOptions& defaults) {
  const LambOptions fresh;
  LambOptions merged = defaults;
  if (group.lr() != fresh.lr()) merged.lr(group.lr());
  if (group.betas() != fresh.betas()) merged.betas(group.betas());
  if (group.eps() != fresh.eps()) merged.eps(group.eps());
  if (group.weight_decay() != fresh.weight_decay()) merged.weight_decay(group.weight_decay());
  if (group.bias_correction() != fresh.bias_correction()) {
    merged.bias_correction(group.bias_correction());
  }
  if (group.adam_w_mode() != fresh.adam_w_mode()) merged.adam_w_mode(group.adam_w_mode());
  if (group.grad_averaging() != fresh.grad_averaging()) {
    merged.grad_averaging(group.grad_averaging());
  }
  if (group.max_grad_norm() != fresh.max_grad_norm()) merged.max_grad_norm(group.max_grad_norm());
  if (group.use_nvlamb() != fresh.use_nvlamb()) merged.use_nvlamb(group.use_nvlamb());
  return merged;
}

// ---- The generic classes: FusedOptimizer<Hyper> -------------------------------------------------

// f(field) for each field of the descriptor's kFields (name, member pointer).
template <class Hyper, class F>
void ForEachField(F&& f) {
  std::apply([&](const auto&... field) { (f(field), ...); }, algos::DescriptorOf<Hyper>::kFields);
}

// libtorch's group merge (as Merged above), field by field.
template <class Hyper>
HyperOptions<Hyper> Merged(const HyperOptions<Hyper>& group, const HyperOptions<Hyper>& defaults) {
  const Hyper fresh;
  HyperOptions<Hyper> merged = defaults;
  ForEachField<Hyper>([&](const auto& field) {
    if (group.hyper().*field.member != fresh.*field.member) {
      merged.hyper().*field.member = group.hyper().*field.member;
    }
  });
  return merged;
}

// The engine's rules for the algorithm's hyper-parameters, as a c10::Error.
template <class Hyper>
void CheckHyper(const Hyper& hyper, std::size_t group) {
  try {
    algos::DescriptorOf<Hyper>::Validate({GenericTraits<Hyper>::kName, group}, hyper);
  } catch (const fusedopt::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// torch::optim::Optimizer::add_param_group (its leaf check and defaults), then the group's own
// options merged with the defaults: libtorch's merge knows only its own options types and would
// give our groups the defaults.
template <class Traits>
void AddParamGroup(torch::optim::Optimizer& optimizer,
                   const torch::optim::OptimizerParamGroup& group) {
  using Options = typename Traits::Options;
  const Options* options = nullptr;
  if (group.has_options()) {
    options = dynamic_cast<const Options*>(&group.options());
    TORCH_CHECK(options != nullptr, Traits::kName, ": a param group's options must be ",
                Traits::kOptionsName);
  }
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(group.params()));
  if (options != nullptr) {
    const auto& defaults = static_cast<const Options&>(optimizer.defaults());
    optimizer.param_groups().back().set_options(
        std::make_unique<Options>(Merged(*options, defaults)));
  }
}

void CheckBetas(const char* name, const std::tuple<double, double>& betas, bool one_allowed) {
  const double values[] = {std::get<0>(betas), std::get<1>(betas)};
  for (int i = 0; i < 2; ++i) {
    const double beta = values[i];
    TORCH_CHECK(0.0 <= beta && (one_allowed ? beta <= 1.0 : beta < 1.0), name,
                ": Invalid beta parameter at index ", i, ": ", beta,
                one_allowed ? " (must be in [0, 1])" : " (must be in [0, 1))");
  }
}

}  // namespace

torch::Tensor SGD::step(LossClosure closure) {
  return detail::FusedStep<SgdTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor Adam::step(LossClosure closure) {
  return detail::FusedStep<AdamTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor AdamW::step(LossClosure closure) {
  return detail::FusedStep<AdamWTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor RMSprop::step(LossClosure closure) {
  return detail::FusedStep<RmspropTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}
torch::Tensor Adagrad::step(LossClosure closure) {
  return detail::FusedStep<AdagradTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}

// ---- Lion ---------------------------------------------------------------------------------------

LionOptions::LionOptions(double lr) : lr_(lr) {}

bool operator==(const LionOptions& lhs, const LionOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() &&
         lhs.weight_decay() == rhs.weight_decay();
}

void LionOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
}

void LionOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
}

double LionOptions::get_lr() const { return lr(); }
void LionOptions::set_lr(double lr) { this->lr(lr); }

bool operator==(const LionParamState& lhs, const LionParamState& rhs) {
  return torch::equal_if_defined(lhs.exp_avg(), rhs.exp_avg());
}

void LionParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
}

void LionParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
}

Lion::Lion(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LionOptions defaults)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<LionOptions>(defaults)) {
  // lion-pytorch asserts these (and its Python twin fusedopt.FusedLion raises ValueError).
  TORCH_CHECK(defaults.lr() > 0.0, LionTraits::kName, ": Invalid learning rate: ", defaults.lr(),
              " (Lion requires lr > 0)");
  CheckBetas(LionTraits::kName, defaults.betas(), /*one_allowed=*/true);
  TORCH_CHECK(defaults.weight_decay() >= 0.0, LionTraits::kName,
              ": Invalid weight_decay value: ", defaults.weight_decay());
  for (const auto& group : param_groups) add_param_group(group);
}

Lion::Lion(std::vector<torch::Tensor> params, LionOptions defaults)
    : Lion({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

void Lion::add_param_group(const torch::optim::OptimizerParamGroup& param_group) {
  AddParamGroup<LionTraits>(*this, param_group);
}

torch::Tensor Lion::step(LossClosure closure) {
  return detail::FusedStep<LionTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}

void Lion::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

void Lion::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

// ---- LAMB ---------------------------------------------------------------------------------------

LambOptions::LambOptions(double lr) : lr_(lr) {}

bool operator==(const LambOptions& lhs, const LambOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() &&
         lhs.bias_correction() == rhs.bias_correction() && lhs.adam_w_mode() == rhs.adam_w_mode() &&
         lhs.grad_averaging() == rhs.grad_averaging() &&
         lhs.max_grad_norm() == rhs.max_grad_norm() && lhs.use_nvlamb() == rhs.use_nvlamb();
}

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adam_w_mode);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(grad_averaging);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_grad_norm);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(use_nvlamb);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, adam_w_mode);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, grad_averaging);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_grad_norm);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, use_nvlamb);
}

double LambOptions::get_lr() const { return lr(); }
void LambOptions::set_lr(double lr) { this->lr(lr); }

bool operator==(const LambParamState& lhs, const LambParamState& rhs) {
  return lhs.step() == rhs.step() && torch::equal_if_defined(lhs.exp_avg(), rhs.exp_avg()) &&
         torch::equal_if_defined(lhs.exp_avg_sq(), rhs.exp_avg_sq());
}

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

LAMB::LAMB(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LambOptions defaults)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<LambOptions>(defaults)) {
  // apex FusedLAMB's checks (and fusedopt.FusedLAMB's), plus its max_grad_norm's.
  TORCH_CHECK(defaults.lr() >= 0.0, LambTraits::kName, ": Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(defaults.eps() >= 0.0, LambTraits::kName,
              ": Invalid epsilon value: ", defaults.eps());
  CheckBetas(LambTraits::kName, defaults.betas(), /*one_allowed=*/false);
  TORCH_CHECK(defaults.weight_decay() >= 0.0, LambTraits::kName,
              ": Invalid weight_decay value: ", defaults.weight_decay());
  CheckLambMaxGradNorm(defaults.max_grad_norm(), "");
  for (const auto& group : param_groups) add_param_group(group);
}

LAMB::LAMB(std::vector<torch::Tensor> params, LambOptions defaults)
    : LAMB({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

void LAMB::add_param_group(const torch::optim::OptimizerParamGroup& param_group) {
  AddParamGroup<LambTraits>(*this, param_group);
}

torch::Tensor LAMB::step(LossClosure closure) {
  return detail::FusedStep<LambTraits>(*this, closure, training_, last_step_, last_pre_pass_);
}

void LAMB::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

void LAMB::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

// ---- The generic classes ------------------------------------------------------------------------

template <class Hyper>
void HyperOptions<Hyper>::serialize(torch::serialize::OutputArchive& archive) const {
  ForEachField<Hyper>(
      [&](const auto& field) { archive.write(field.name, c10::IValue(hyper_.*field.member)); });
}

template <class Hyper>
void HyperOptions<Hyper>::serialize(torch::serialize::InputArchive& archive) {
  ForEachField<Hyper>([&](const auto& field) {
    c10::IValue value;
    archive.read(field.name, value);
    auto& member = hyper_.*field.member;
    using T = std::remove_reference_t<decltype(member)>;
    if constexpr (std::is_same_v<T, bool>) {
      member = value.toBool();
    } else if constexpr (std::is_integral_v<T>) {  // an enum code (BertAdam's schedule)
      member = static_cast<T>(value.toInt());
    } else {
      member = value.toDouble();
    }
  });
}

template <class Hyper>
bool HyperOptions<Hyper>::operator==(const HyperOptions& other) const {
  bool equal = true;
  ForEachField<Hyper>([&](const auto& field) {
    equal = equal && hyper_.*field.member == other.hyper_.*field.member;
  });
  return equal;
}

template <class Hyper>
bool HyperParamState<Hyper>::operator==(const HyperParamState& other) const {
  bool equal = step() == other.step();
  for (int k = 0; k < kMaxStates; ++k) {
    equal = equal && torch::equal_if_defined(tensors[k], other.tensors[k]);
  }
  for (int k = 0; k < kMaxScalars; ++k) {
    equal = equal && torch::equal_if_defined(scalars[k], other.scalars[k]);
  }
  return equal;
}

template <class Hyper>
torch::Tensor& HyperParamState<Hyper>::state(std::string_view key) {
  using D = algos::DescriptorOf<Hyper>;
  for (int k = 0; k < kMaxStates; ++k) {
    if (key == D::kStates[k] && !key.empty()) return tensors[k];
  }
  if constexpr (algos::HasScalarStates<D>) {
    for (std::size_t k = 0; k < D::kScalarStates.size(); ++k) {
      if (key == D::kScalarStates[k]) return scalars[k];
    }
  }
  TORCH_CHECK(false, GenericTraits<Hyper>::kName, " has no state '", key, "'");
}

// Each state under its torch key (what the algorithm has not created yet is not written).
template <class Hyper>
void HyperParamState<Hyper>::serialize(torch::serialize::OutputArchive& archive) const {
  using D = algos::DescriptorOf<Hyper>;
  archive.write("step", c10::IValue(step()));
  for (int k = 0; k < kMaxStates; ++k) {
    if (*D::kStates[k] != '\0' && tensors[k].defined()) archive.write(D::kStates[k], tensors[k]);
  }
  if constexpr (algos::HasScalarStates<D>) {
    for (std::size_t k = 0; k < D::kScalarStates.size(); ++k) {
      if (scalars[k].defined()) archive.write(D::kScalarStates[k], scalars[k]);
    }
  }
}

template <class Hyper>
void HyperParamState<Hyper>::serialize(torch::serialize::InputArchive& archive) {
  using D = algos::DescriptorOf<Hyper>;
  c10::IValue step_value;
  archive.read("step", step_value);
  step(step_value.toInt());
  for (int k = 0; k < kMaxStates; ++k) {
    tensors[k] = torch::Tensor();
    if (*D::kStates[k] != '\0') archive.try_read(D::kStates[k], tensors[k]);
  }
  if constexpr (algos::HasScalarStates<D>) {
    for (std::size_t k = 0; k < D::kScalarStates.size(); ++k) {
      scalars[k] = torch::Tensor();
      archive.try_read(D::kScalarStates[k], scalars[k]);
    }
  }
}

template <class Hyper>
FusedOptimizer<Hyper>::FusedOptimizer(
    const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<Options>(defaults)) {
  CheckHyper(defaults.hyper(), 0);
  for (const auto& group : param_groups) add_param_group(group);
}

template <class Hyper>
FusedOptimizer<Hyper>::FusedOptimizer(std::vector<torch::Tensor> params, Options defaults)
    : FusedOptimizer({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

template <class Hyper>
void FusedOptimizer<Hyper>::add_param_group(const torch::optim::OptimizerParamGroup& param_group) {
  AddParamGroup<GenericTraits<Hyper>>(*this, param_group);
  const auto& added = static_cast<const Options&>(param_groups().back().options());
  try {
    CheckHyper(added.hyper(), param_groups().size() - 1);
  } catch (...) {
    param_groups().pop_back();  // a rejected group is not kept
    throw;
  }
}

template <class Hyper>
std::string FusedOptimizer<Hyper>::class_name() {
  return GenericTraits<Hyper>::kName;
}

template <class Hyper>
torch::Tensor FusedOptimizer<Hyper>::step(LossClosure closure) {
  return detail::FusedStep<GenericTraits<Hyper>>(*this, closure, training_, last_step_,
                                                 last_pre_pass_);
}

template <class Hyper>
void FusedOptimizer<Hyper>::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<ParamState, Options>(archive, *this);
}

template <class Hyper>
void FusedOptimizer<Hyper>::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<ParamState, Options>(archive, *this);
}

// Every algorithm's generic class (optim.h names those without a class of their own).
#define FOPT_INSTANTIATE(A)                         \
  template class HyperOptions<algos::A::Hyper>;     \
  template struct HyperParamState<algos::A::Hyper>; \
  template class FusedOptimizer<algos::A::Hyper>;
FOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt::pt
