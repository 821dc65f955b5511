// fusedopt._C: the fused engine for the Python package. It sees tensors only as integers (data
// pointer, element count, dtype code) that python/fusedopt passes in, so it links neither libtorch
// nor its C++ ABI and one build serves any torch version. The Python side keeps the tensors alive
// for the duration of a call, which lets every compute binding release the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/scaler.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"

namespace py = pybind11;

namespace fusedopt {

void BindSchedules(py::module_& m);  // schedule_bindings.cc

namespace {

// One parameter tensor as python/fusedopt/_base.py packs it. What changes from step to step comes
// first, so Python can append a tail cached from the previous step.
using SegmentTuple = std::tuple<std::uintptr_t,                                  // param
                                std::uintptr_t,                                  // grad
                                int,                                             // grad dtype code
                                float,                                           // grad_scale
                                std::uintptr_t, std::uintptr_t, std::uintptr_t,  // state[0..2]
                                std::uintptr_t,                                  // f32 master or 0
                                std::size_t,                                     // numel
                                int, int,        // param, state dtype codes
                                std::uint32_t,   // group
                                std::uintptr_t,  // f32 step counter (torch's state['step']) or 0
                                std::int64_t,    // step, when there is no counter (SGD)
                                bool, std::uint64_t,  // stochastic_rounding, rounding_seed
                                std::uint64_t>;       // global_offset
using GradTuple = std::tuple<std::uintptr_t, std::size_t, int>;  // data, numel, dtype code

// Addresses come from torch's data_ptr(); 0 stands for "none".
template <class T>
T* Ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr)
}

// The largest state['step'] accepted: any f32 below it converts to int64 exactly, with room for the
// step being taken (and one more per repeated occurrence of the param).
constexpr float kMaxStepCount = 0x1p62f;

// torch keeps the count in an f32 tensor; the step being taken is one more. The float is checked
// before the cast (NaN, Inf or a value beyond int64 would make it undefined behaviour).
std::int64_t NextStep(std::size_t segment, std::uintptr_t step_ptr) {
  const float count = *Ptr<const float>(step_ptr);
  if (!(count >= 0.0f && count < kMaxStepCount)) {
    std::ostringstream out;
    out << "segment " << segment << ": invalid state['step']: " << count
        << " (must be a finite count in [0, 2^62))";
    throw Error(out.str());
  }
  return static_cast<std::int64_t>(count) + 1;
}

// With `repeats`, a counter that several segments share (the same param listed twice) advances
// once per occurrence, as torch's for-loop does: the k-th occurrence takes step count + k.
std::vector<Segment> ToSegments(const std::vector<SegmentTuple>& packed, bool repeats) {
  std::vector<Segment> segments(packed.size());
  std::unordered_map<std::uintptr_t, std::int64_t> taken;  // step_ptr -> occurrences so far
  for (std::size_t i = 0; i < packed.size(); ++i) {
    const auto& [param, grad, gd, grad_scale, s0, s1, s2, master, numel, pd, sd, group, step_ptr,
                 step, stochastic, seed, offset] = packed[i];
    Segment& s = segments[i];
    s.param = Ptr<void>(param);
    s.grad = Ptr<const void>(grad);
    s.state[0] = Ptr<void>(s0);
    s.state[1] = Ptr<void>(s1);
    s.state[2] = Ptr<void>(s2);
    s.master = Ptr<float>(master);
    s.numel = numel;
    s.param_dtype = static_cast<DType>(pd);
    s.grad_dtype = static_cast<DType>(gd);
    s.state_dtype = static_cast<DType>(sd);
    s.group = group;
    s.step = step;
    if (step_ptr != 0) s.step = NextStep(i, step_ptr) + (repeats ? taken[step_ptr]++ : 0);
    s.grad_scale = grad_scale;
    s.stochastic_rounding = stochastic;
    s.rounding_seed = seed;
    s.global_offset = offset;
  }
  return segments;
}

// What a step call reports back to Python: (stepped, found_inf, grad_norm or None, clip_coef).
using StepReport = std::tuple<bool, bool, std::optional<double>, float>;

// Runs one fused training step (fusedopt/training_step.h) over every segment, then advances the
// step counters (only once the step has succeeded, so a rejected or skipped call changes nothing).
// With `check` or a finite max_norm, the pre-pass runs first: one read of the gradients for
// overflow and norm, the clip factor folded into each segment's grad_scale; an overflow skips the
// update.
//
// `wave_ends` splits the segments into waves updated one after the other (empty: one wave). Python
// puts a param listed twice, or params that overlap in memory, into different waves, so that the
// engine's parallel pass never updates one element from two segments at once and the later
// occurrence sees the earlier one's update, like torch's for-loop. With `validate_only`, only the
// checks run (the step functions validate before touching a buffer, and with no elements they
// touch none).
template <class Hyper>
StepReport RunStep(const std::vector<Hyper>& groups, const std::vector<SegmentTuple>& packed,
                   int num_threads, double max_norm, int norm_type, int clip_rule, bool check,
                   const std::vector<std::size_t>& wave_ends, bool validate_only) {
  std::vector<Segment> segments = ToSegments(packed, wave_ends.size() > 1);
  StepReport report{false, false, std::nullopt, 1.0f};
  {
    py::gil_scoped_release release;
    Runtime runtime(num_threads);
    if (validate_only) {
      for (Segment& s : segments) s.numel = 0;
      FusedStep(std::span<const Hyper>(groups), std::span<const Segment>(segments), runtime);
      return report;
    }
    const StepResult step =
        TrainingStep(std::span<const Hyper>(groups), std::span<Segment>(segments),
                     {.check_overflow = check,
                      .max_grad_norm = max_norm,
                      .norm_type = static_cast<NormType>(norm_type),
                      .clip_rule = static_cast<ClipRule>(clip_rule),
                      .wave_ends = wave_ends},
                     runtime);
    report = {step.stepped, step.found_inf, step.grad_norm, step.clip_coef};
    if (!step.stepped) return report;
  }
  // In packing order, so a repeated counter ends at its last (largest) occurrence.
  for (std::size_t i = 0; i < packed.size(); ++i) {
    const std::uintptr_t step_ptr = std::get<12>(packed[i]);
    if (step_ptr != 0) *Ptr<float>(step_ptr) = static_cast<float>(segments[i].step);
  }
  return report;
}

std::vector<GradBuffer> ToGradBuffers(const std::vector<GradTuple>& packed) {
  std::vector<GradBuffer> grads;
  grads.reserve(packed.size());
  for (const auto& [data, numel, dtype] : packed) {
    grads.push_back({Ptr<void>(data), numel, static_cast<DType>(dtype)});
  }
  return grads;
}

// Binds A::Hyper as _C.<Name>Hyper (keyword arguments and attributes: the descriptor's fields,
// defaults: the C++ struct's) and its step as _C.<name>_step(groups, segments, num_threads,
// max_norm, norm_type, clip_rule, check, wave_ends, validate_only) -> StepReport (see RunStep;
// fusedopt::Error surfaces as ValueError; norm_type 2, 1, or 0 for inf; clip_rule 0 torch, 1
// LAMB). algorithms[name] = {"hyper": class, "step": function, "state_names": torch's keys of the
// state slots}.
template <class A>
void BindAlgorithm(py::module_& m, py::dict& algorithms) {
  using Hyper = typename A::Hyper;
  const std::string step_name = A::kStepName;  // "LionStep" -> "LionHyper"
  const std::string class_name = step_name.substr(0, step_name.size() - 4) + "Hyper";
  py::class_<Hyper> hyper(m, class_name.c_str());
  hyper.def(py::init([](const py::kwargs& fields) {
    Hyper h;
    std::size_t used = 0;
    std::apply(
        [&](const auto&... f) {
          const auto set = [&](const auto& field) {
            if (!fields.contains(field.name)) return;
            using T = std::remove_reference_t<decltype(h.*(field.member))>;
            h.*(field.member) = fields[field.name].template cast<T>();
            ++used;
          };
          (set(f), ...);
        },
        A::kFields);
    if (used != fields.size()) {
      throw py::type_error(std::string(A::kName) + ": unknown hyper-parameter in " +
                           py::str(fields).cast<std::string>());
    }
    return h;
  }));
  std::apply([&](const auto&... f) { (hyper.def_readwrite(f.name, f.member), ...); }, A::kFields);
  hyper.def("required_states", [](const Hyper& h) { return A::RequiredStates(h); });
  const std::string fn_name = std::string(A::kName) + "_step";
  m.def(fn_name.c_str(), &RunStep<Hyper>, py::arg("groups"), py::arg("segments"),
        py::arg("num_threads"), py::arg("max_norm") = std::numeric_limits<double>::infinity(),
        py::arg("norm_type") = 2, py::arg("clip_rule") = 0, py::arg("check") = false,
        py::arg("wave_ends") = std::vector<std::size_t>{}, py::arg("validate_only") = false);
  py::list state_names;
  for (const char* name : A::kStates) {
    if (*name != '\0') state_names.append(name);
  }
  py::dict entry;
  entry["hyper"] = hyper;
  entry["step"] = m.attr(fn_name.c_str());
  entry["state_names"] = py::tuple(state_names);
  algorithms[A::kName] = entry;
}

}  // namespace
}  // namespace fusedopt

PYBIND11_MODULE(_C, m) {
  using namespace fusedopt;
  m.doc() = "fusedopt's fused CPU engine (internal: use the fusedopt package)";

  // Every algorithm of the registry (src/algos/registry.h): its Hyper struct, its step function
  // and what Python needs to know of its state.
  py::dict algorithms;
  algos::All::ForEach(
      [&](auto descriptor) { BindAlgorithm<typename decltype(descriptor)::type>(m, algorithms); });
  m.attr("algorithms") = algorithms;

  m.def(
      "grad_norm",
      [](const std::vector<GradTuple>& grads, int norm_type, float scale, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        const GradStats stats = GradNorm(buffers, static_cast<NormType>(norm_type), scale, runtime);
        return std::make_pair(stats.non_finite, stats.norm);
      },
      "(non_finite, norm) of all gradients times scale, in one read; norm_type 2, 1 or 0 (inf).");
  m.def("clip_coefficient", &ClipCoefficient, "torch's min(1, max_norm / (norm + 1e-6)) in f32.");
  m.def(
      "clip_grad_value",
      [](const std::vector<GradTuple>& grads, double clip_value, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        ClipGradValue(buffers, clip_value, runtime);
      },
      "Clamps every gradient element to [-clip_value, clip_value] in place.");
  m.def(
      "accumulate_grads",
      [](const std::vector<GradTuple>& grads, const std::vector<std::uintptr_t>& accumulators,
         float scale, bool overwrite, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        std::vector<float*> sums;
        sums.reserve(accumulators.size());
        for (std::uintptr_t a : accumulators) sums.push_back(Ptr<float>(a));
        py::gil_scoped_release release;
        Runtime runtime(threads);
        return AccumulateGrads(buffers, sums, scale, overwrite, runtime);
      },
      "f32 accumulators (+)= grads * scale; returns whether any gradient was non-finite.");

  py::class_<LossScaler>(m, "LossScaler")
      .def(py::init([](float init_scale, double growth_factor, double backoff_factor,
                       std::int64_t growth_interval, float min_scale, float max_scale,
                       bool dynamic) {
             return LossScaler({init_scale, growth_factor, backoff_factor, growth_interval,
                                min_scale, max_scale, dynamic});
           }),
           py::arg("init_scale") = 65536.0f, py::arg("growth_factor") = 2.0,
           py::arg("backoff_factor") = 0.5, py::arg("growth_interval") = 2000,
           py::arg("min_scale") = 0.0f,
           py::arg("max_scale") = std::numeric_limits<float>::infinity(), py::arg("dynamic") = true)
      .def_property_readonly("scale", &LossScaler::scale)
      .def_property_readonly("inv_scale", &LossScaler::inv_scale)
      .def_property_readonly("growth_tracker", &LossScaler::growth_tracker)
      .def("update", &LossScaler::Update, py::arg("found_inf"))
      .def("restore", &LossScaler::Restore, py::arg("scale"), py::arg("growth_tracker"));

  m.def(
      "has_non_finite",
      [](const std::vector<GradTuple>& grads, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        return HasNonFinite(buffers, runtime);
      },
      "True if any gradient element is +-Inf or NaN (one read, nothing written).");
  m.def(
      "unscale_grads",
      [](const std::vector<GradTuple>& grads, float scale, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        return UnscaleGrads(buffers, scale, runtime);
      },
      "grads *= scale in place; returns whether any element was non-finite before.");

  BindSchedules(m);

  m.def("active_target", &ActiveTargetName);
  m.def("available_targets", &AvailableTargets);
  m.def("force_target", &ForceTarget);
}
