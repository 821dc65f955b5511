// The fusedopt::pt optimizers' step(), and the generic classes (FusedOptimizer<Hyper> with its
// HyperOptions and HyperParamState) written from the descriptors' field and state lists: the
// reference's group keys (algos::Field), state keys and rules. How each class maps its options and
// param state onto the core's hyper struct and Segment::state slots is optim_traits.h; the loop is
// fused_step.h.

#include "fusedopt/pt/optim.h"

#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
#include "src/algos/registry.h"
#include "src/torch/fused_step.h"
#include "src/torch/optim_traits.h"

namespace fusedopt::pt {
namespace {

using detail::AdagradTraits;
using detail::AdamTraits;
using detail::AdamWTraits;
using detail::CheckLambMaxGradNorm;
using detail::ClipsGlobally;
using detail::GenericTraits;
using detail::RmspropTraits;
using detail::SgdTraits;

// f(field) for each field of the descriptor of Hyper (algos::Field: name, member, group key).
template <class Hyper, class F>
void ForEachField(F&& f) {
  algos::ForEachField<algos::DescriptorOf<Hyper>>(std::forward<F>(f));
}

// Whether a and b differ in a field kept under torch's group key `key` (both parts of betas).
template <class Hyper>
bool KeyDiffers(std::string_view key, const Hyper& a, const Hyper& b) {
  bool differs = false;
  ForEachField<Hyper>([&](const auto& field) {
    differs = differs || (field.GroupKey() == key && a.*field.member != b.*field.member);
  });
  return differs;
}

// libtorch 2.13's rule for a param group given its own options (its optimizers'
// _merge_by_comparison): a key that differs from its constructor default is the group's (betas as
// a pair, as torch compares its tuples), the others come from the optimizer's defaults.
template <class Hyper>
HyperOptions<Hyper> Merged(const HyperOptions<Hyper>& group, const HyperOptions<Hyper>& defaults) {
  const HyperOptions<Hyper> fresh;
  HyperOptions<Hyper> merged = defaults;
  ForEachField<Hyper>([&](const auto& field) {
    if (KeyDiffers(field.GroupKey(), group.hyper(), fresh.hyper())) {
      merged.hyper().*field.member = group.hyper().*field.member;
    }
  });
  if constexpr (ClipsGlobally<Hyper>) {
    if (group.max_grad_norm() != fresh.max_grad_norm()) merged.max_grad_norm(group.max_grad_norm());
  }
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

void CheckBetas(const std::string& name, const std::tuple<double, double>& betas,
                bool one_allowed) {
  const double values[] = {std::get<0>(betas), std::get<1>(betas)};
  for (int i = 0; i < 2; ++i) {
    const double beta = values[i];
    TORCH_CHECK(0.0 <= beta && (one_allowed ? beta <= 1.0 : beta < 1.0), name,
                ": Invalid beta parameter at index ", i, ": ", beta,
                one_allowed ? " (must be in [0, 1])" : " (must be in [0, 1))");
  }
}

// What the constructor checks of its defaults: the reference constructor's own rules and messages
// where it has them (lion-pytorch asserts lr > 0, which a schedule may reach later; apex FusedLAMB
// checks its arguments; the Python fusedopt.FusedLion and FusedLAMB raise the same), else the
// engine's rules for the algorithm.
template <class Hyper>
void CheckDefaults(const HyperOptions<Hyper>& defaults) {
  const std::string& name = GenericTraits<Hyper>::kName;
  if constexpr (std::is_same_v<Hyper, LionHyper>) {
    TORCH_CHECK(defaults.lr() > 0.0, name, ": Invalid learning rate: ", defaults.lr(),
                " (Lion requires lr > 0)");
    CheckBetas(name, defaults.betas(), /*one_allowed=*/true);
    TORCH_CHECK(defaults.weight_decay() >= 0.0, name,
                ": Invalid weight_decay value: ", defaults.weight_decay());
  } else if constexpr (std::is_same_v<Hyper, LambHyper>) {
    TORCH_CHECK(defaults.lr() >= 0.0, name, ": Invalid learning rate: ", defaults.lr());
    TORCH_CHECK(defaults.eps() >= 0.0, name, ": Invalid epsilon value: ", defaults.eps());
    CheckBetas(name, defaults.betas(), /*one_allowed=*/false);
    TORCH_CHECK(defaults.weight_decay() >= 0.0, name,
                ": Invalid weight_decay value: ", defaults.weight_decay());
    CheckLambMaxGradNorm(defaults.max_grad_norm(), "");
  } else {
    CheckHyper(defaults.hyper(), 0);
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

// A field's value as the archive holds it, and back.
template <class T>
c10::IValue ToIValue(const T& value) {
  if constexpr (std::is_same_v<T, bool> || std::is_floating_point_v<T>) {
    return c10::IValue(value);
  } else {
    return c10::IValue(static_cast<std::int64_t>(value));  // an enum code (BertAdam's schedule)
  }
}
template <class T>
T FromIValue(const c10::IValue& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value.toBool();
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(value.toInt());
  } else {
    return static_cast<T>(value.toDouble());
  }
}

// The 8-bit states' absmax under "<key>_absmax" (the Python classes' key), for the state keys of
// descriptor D; an absmax not in the archive is left undefined.
template <class D>
void WriteAbsmax(const StateAbsmax& s, torch::serialize::OutputArchive& archive) {
  for (int k = 0; k < kMaxStates; ++k) {
    if (*D::kStates[k] != '\0' && s.absmax[k].defined()) {
      archive.write(std::string(D::kStates[k]) + "_absmax", s.absmax[k]);
    }
  }
}
template <class D>
void ReadAbsmax(StateAbsmax& s, torch::serialize::InputArchive& archive) {
  for (int k = 0; k < kMaxStates; ++k) {
    s.absmax[k] = torch::Tensor();
    if (*D::kStates[k] != '\0')
      archive.try_read(std::string(D::kStates[k]) + "_absmax", s.absmax[k]);
  }
}

// A drop-in's load(): torch's, with each param state read as a ParamStateWithAbsmax (torch's keys
// and the absmax). An archive of libtorch before 1.5 (no "pytorch_version") goes to torch's own.
template <class Traits>
void LoadTwin(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  using Twin = typename Traits::Twin;
  c10::IValue version;
  if (!archive.try_read("pytorch_version", version)) {
    static_cast<Twin&>(optimizer).Twin::load(archive);
    return;
  }
  torch::optim::serialize<typename Traits::StateWithAbsmax, typename Traits::Options>(archive,
                                                                                      optimizer);
}

// The accumulation window in a torch::save archive, under "fusedopt_accumulation" (absent outside a
// window): how far it is and, by each param's index in all groups laid end to end, its f32 sum
// ("sum.<i>") or the sum torch keeps for a routed param ("torch_sum.<i>", dense).
void WriteWindow(const torch::optim::Optimizer& optimizer, const detail::Accumulation& acc,
                 torch::serialize::OutputArchive& archive) {
  if (acc.window.pending == 0) return;
  torch::serialize::OutputArchive window(archive.compilation_unit());
  window.write("micro_batches", c10::IValue(acc.window.pending));
  window.write("steps", c10::IValue(acc.window.steps));
  window.write("found_inf", c10::IValue(acc.window.found_inf));
  std::size_t i = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      const std::string index = std::to_string(i++);
      const auto sum = acc.sums.find(p.unsafeGetTensorImpl());
      if (sum != acc.sums.end() && sum->second.in_window) {
        window.write("sum." + index, sum->second.sum);
      }
      const auto routed = acc.routed.find(p.unsafeGetTensorImpl());
      if (routed != acc.routed.end()) {
        const torch::Tensor& t = routed->second.sum;
        window.write("torch_sum." + index, t.is_sparse() ? t.to_dense() : t);
      }
    }
  }
  archive.write("fusedopt_accumulation", window);
}

// The window of a torch::load archive (WriteWindow's), checked against the optimizer before
// anything is loaded; an empty one where the archive holds none.
detail::Accumulation ReadWindow(const torch::optim::Optimizer& optimizer,
                                const TrainingOptions& training,
                                torch::serialize::InputArchive& archive) {
  detail::Accumulation acc;
  acc.window.steps = training.accumulation_steps;
  torch::serialize::InputArchive window;
  if (!archive.try_read("fusedopt_accumulation", window)) return acc;
  c10::IValue value;
  window.read("micro_batches", value);
  acc.window.pending = value.toInt();
  window.read("steps", value);
  TORCH_CHECK(value.toInt() == acc.window.steps, "the archive is ", acc.window.pending,
              " micro-batches into an accumulation window of ", value.toInt(),
              "; training().accumulation_steps is ", acc.window.steps,
              " (set it before torch::load)");
  window.read("found_inf", value);
  acc.window.found_inf = value.toBool();
  std::size_t i = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      const std::string index = std::to_string(i++);
      for (const bool routed : {false, true}) {
        torch::Tensor sum;
        if (!window.try_read((routed ? "torch_sum." : "sum.") + index, sum)) continue;
        TORCH_CHECK(sum.sizes() == p.sizes(), "the archive's accumulation sum of param ", index,
                    " has shape ", sum.sizes(), ", the param ", p.sizes());
        (routed ? acc.routed : acc.sums)[p.unsafeGetTensorImpl()] = {
            .param = p, .sum = sum, .in_window = true};
      }
    }
  }
  return acc;
}

}  // namespace

template <class Base, class Hyper>
void ParamStateWithAbsmax<Base, Hyper>::serialize(torch::serialize::OutputArchive& archive) const {
  Base::serialize(archive);
  WriteAbsmax<algos::DescriptorOf<Hyper>>(*this, archive);
}

template <class Base, class Hyper>
void ParamStateWithAbsmax<Base, Hyper>::serialize(torch::serialize::InputArchive& archive) {
  Base::serialize(archive);
  ReadAbsmax<algos::DescriptorOf<Hyper>>(*this, archive);
}

template struct ParamStateWithAbsmax<torch::optim::SGDParamState, SgdHyper>;
template struct ParamStateWithAbsmax<torch::optim::AdamParamState, AdamHyper>;
template struct ParamStateWithAbsmax<torch::optim::AdamWParamState, AdamWHyper>;
template struct ParamStateWithAbsmax<torch::optim::RMSpropParamState, RmspropHyper>;
template struct ParamStateWithAbsmax<torch::optim::AdagradParamState, AdagradHyper>;

void SgdParamState::serialize(torch::serialize::OutputArchive& archive) const {
  ParamStateWithAbsmax::serialize(archive);
  if (rounding_step() != 0) archive.write("rounding_step", c10::IValue(rounding_step()));
}

void SgdParamState::serialize(torch::serialize::InputArchive& archive) {
  ParamStateWithAbsmax::serialize(archive);
  c10::IValue count;
  rounding_step(archive.try_read("rounding_step", count) ? count.toInt() : 0);
}

#define FOPT_DEFINE_SAVE_LOAD(Class, Traits)                              \
  void Class::save(torch::serialize::OutputArchive& archive) const {      \
    torch::optim::Class::save(archive);                                   \
    WriteWindow(*this, accumulation(), archive);                          \
  }                                                                       \
  void Class::load(torch::serialize::InputArchive& archive) {             \
    detail::Accumulation window = ReadWindow(*this, training(), archive); \
    LoadTwin<Traits>(*this, archive);                                     \
    accumulation() = std::move(window);                                   \
  }
FOPT_DEFINE_SAVE_LOAD(SGD, SgdTraits)
FOPT_DEFINE_SAVE_LOAD(Adam, AdamTraits)
FOPT_DEFINE_SAVE_LOAD(AdamW, AdamWTraits)
FOPT_DEFINE_SAVE_LOAD(RMSprop, RmspropTraits)
FOPT_DEFINE_SAVE_LOAD(Adagrad, AdagradTraits)
#undef FOPT_DEFINE_SAVE_LOAD

torch::Tensor SGD::step(LossClosure closure) {
  return detail::FusedStep<SgdTraits>(*this, closure, training_, last_step_, last_pre_pass_,
                                      accumulation_);
}
torch::Tensor Adam::step(LossClosure closure) {
  return detail::FusedStep<AdamTraits>(*this, closure, training_, last_step_, last_pre_pass_,
                                       accumulation_);
}
torch::Tensor AdamW::step(LossClosure closure) {
  return detail::FusedStep<AdamWTraits>(*this, closure, training_, last_step_, last_pre_pass_,
                                        accumulation_);
}
torch::Tensor RMSprop::step(LossClosure closure) {
  return detail::FusedStep<RmspropTraits>(*this, closure, training_, last_step_, last_pre_pass_,
                                          accumulation_);
}
torch::Tensor Adagrad::step(LossClosure closure) {
  return detail::FusedStep<AdagradTraits>(*this, closure, training_, last_step_, last_pre_pass_,
                                          accumulation_);
}

// ---- The generic classes ------------------------------------------------------------------------

// Under the reference's group keys, as torch's own options write theirs: a tuple-valued key
// (betas) once, its parts in order; LAMB's max_grad_norm beside them.
template <class Hyper>
void HyperOptions<Hyper>::serialize(torch::serialize::OutputArchive& archive) const {
  ForEachField<Hyper>([&](const auto& field) {
    if (!field.InTuple()) {
      archive.write(std::string(field.GroupKey()), ToIValue(hyper_.*field.member));
      return;
    }
    if (field.index != 0) return;  // written with part 0
    std::vector<c10::IValue> parts;
    ForEachField<Hyper>([&](const auto& part) {
      if (part.GroupKey() != field.GroupKey()) return;
      if (parts.size() <= static_cast<std::size_t>(part.index)) parts.resize(part.index + 1);
      parts[part.index] = ToIValue(hyper_.*part.member);
    });
    archive.write(std::string(field.GroupKey()), c10::ivalue::Tuple::create(std::move(parts)));
  });
  if constexpr (ClipsGlobally<Hyper>) {
    archive.write("max_grad_norm", c10::IValue(extra_.max_grad_norm));
  }
}

// Also reads archives written before the group keys, which held each field under its name (beta1,
// beta2), and an optional field's absence (Lion's maximize, which lion-pytorch lacks) as its
// default.
template <class Hyper>
void HyperOptions<Hyper>::serialize(torch::serialize::InputArchive& archive) {
  ForEachField<Hyper>([&](const auto& field) {
    const std::string key(field.GroupKey());
    c10::IValue value;
    if (archive.try_read(key, value)) {
      if (field.InTuple()) value = value.toTupleRef().elements().at(field.index);
    } else if (!archive.try_read(field.name, value)) {
      if (field.optional) return;
      archive.read(key, value);  // torch's error naming the missing key
    }
    auto& member = hyper_.*field.member;
    member = FromIValue<std::remove_reference_t<decltype(member)>>(value);
  });
  if constexpr (ClipsGlobally<Hyper>) {
    c10::IValue value;
    archive.read("max_grad_norm", value);
    extra_.max_grad_norm = value.toDouble();
  }
}

template <class Hyper>
bool HyperOptions<Hyper>::operator==(const HyperOptions& other) const {
  bool equal = true;
  ForEachField<Hyper>([&](const auto& field) {
    equal = equal && hyper_.*field.member == other.hyper_.*field.member;
  });
  if constexpr (ClipsGlobally<Hyper>) {
    equal = equal && extra_.max_grad_norm == other.extra_.max_grad_norm;
  }
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
  for (int k = 0; k < kMaxStates; ++k) {
    equal = equal && torch::equal_if_defined(absmax[k], other.absmax[k]);
  }
  return equal;
}

template <class Hyper>
const torch::Tensor& HyperParamState<Hyper>::state(std::string_view key) const {
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

template <class Hyper>
torch::Tensor& HyperParamState<Hyper>::state(std::string_view key) {
  return const_cast<torch::Tensor&>(std::as_const(*this).state(key));
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
  WriteAbsmax<D>(*this, archive);
}

template <class Hyper>
void HyperParamState<Hyper>::serialize(torch::serialize::InputArchive& archive) {
  using D = algos::DescriptorOf<Hyper>;
  c10::IValue step_value;  // absent in the archives of Lion's own class (lion-pytorch counts none)
  step(archive.try_read("step", step_value) ? step_value.toInt() : 0);
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
  ReadAbsmax<D>(*this, archive);
}

template <class Hyper>
FusedOptimizer<Hyper>::FusedOptimizer(
    const std::vector<torch::optim::OptimizerParamGroup>& param_groups, Options defaults)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              std::make_unique<Options>(defaults)) {
  CheckDefaults(defaults);
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
                                                 last_pre_pass_, accumulation_);
}

template <class Hyper>
void FusedOptimizer<Hyper>::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<ParamState, Options>(archive, *this);
  WriteWindow(*this, accumulation(), archive);
}

template <class Hyper>
void FusedOptimizer<Hyper>::load(torch::serialize::InputArchive& archive) {
  detail::Accumulation window = ReadWindow(*this, training(), archive);
  torch::optim::serialize<ParamState, Options>(archive, *this);
  accumulation() = std::move(window);
}

// Every algorithm's generic class (optim.h's ClassOf names those without a class of their own).
// HyperOptions' members defined here, not the whole class: clang 14 would also instantiate the
// builders whose requires-clause fails (against [temp.explicit]/10; g++ skips them).
#define FOPT_INSTANTIATE(Stem, Alias)                                                         \
  template void HyperOptions<Stem##Hyper>::serialize(torch::serialize::OutputArchive&) const; \
  template void HyperOptions<Stem##Hyper>::serialize(torch::serialize::InputArchive&);        \
  template bool HyperOptions<Stem##Hyper>::operator==(const HyperOptions&) const;             \
  template struct HyperParamState<Stem##Hyper>;                                               \
  template class FusedOptimizer<Stem##Hyper>;
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt::pt
