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

// Runs every check of a step call over all segments and writes nothing: the step functions
// validate all arguments before touching a buffer, and with no elements they touch none. (The
// checks that need elements are the null-pointer ones, which Python's packing cannot fail: a
// tensor with elements has a non-null data_ptr.)
template <class Hyper, class StepFn>
void ValidateOnly(const std::vector<Hyper>& groups, std::vector<Segment> segments, Runtime& runtime,
                  StepFn step_fn) {
  for (Segment& s : segments) s.numel = 0;
  step_fn(std::span<const Hyper>(groups), std::span<const Segment>(segments), runtime);
}

// Runs one fused step over every segment, then advances the step counters (only once the step
// has succeeded, so a rejected or skipped call changes nothing). With `check` or a finite max_norm,
// the fused pre-pass runs first: one read of the gradients for overflow and norm, the clip factor
// folded into each segment's grad_scale; an overflow skips the update.
//
// `wave_ends` splits the segments into waves updated one after the other (empty: one wave). Python
// puts a param listed twice, or params that overlap in memory, into different waves, so that the
// engine's parallel pass never updates one element from two segments at once and the later
// occurrence sees the earlier one's update, like torch's for-loop. Everything is validated and the
// pre-pass runs once, over all segments, before the first wave writes. With `validate_only`, only
// the checks run.
template <class Hyper, class StepFn>
StepReport RunStep(const std::vector<Hyper>& groups, const std::vector<SegmentTuple>& packed,
                   int num_threads, double max_norm, int norm_type, bool check,
                   const std::vector<std::size_t>& wave_ends, bool validate_only, StepFn step_fn) {
  for (std::size_t w = 0; w < wave_ends.size(); ++w) {
    const std::size_t begin = w == 0 ? 0 : wave_ends[w - 1];
    if (wave_ends[w] < begin || wave_ends[w] > packed.size() ||
        (w + 1 == wave_ends.size() && wave_ends[w] != packed.size())) {
      throw Error("fusedopt: invalid wave_ends (must rise to the number of segments, " +
                  std::to_string(packed.size()) + ")");
    }
  }
  const bool waves = wave_ends.size() > 1;
  std::vector<Segment> segments = ToSegments(packed, waves);
  StepReport report{false, false, std::nullopt, 1.0f};
  {
    py::gil_scoped_release release;
    Runtime runtime(num_threads);
    if (waves || validate_only) {
      ValidateOnly(groups, segments, runtime, step_fn);
      if (validate_only) return report;
    }
    if (check || std::isfinite(max_norm)) {
      // Validate the hyper-parameters before the pre-pass may change grad_scale.
      step_fn(std::span<const Hyper>(groups), std::span<const Segment>(), runtime);
      const PrePassResult pre = GradPrePass(
          segments, {.max_norm = max_norm, .norm_type = static_cast<NormType>(norm_type)}, runtime);
      std::get<1>(report) = pre.non_finite;
      std::get<2>(report) = pre.norm;
      std::get<3>(report) = pre.clip_coef;
      if (pre.non_finite) return report;
    }
    const std::span<const Segment> all(segments);
    const std::vector<std::size_t> ends = waves ? wave_ends : std::vector{segments.size()};
    std::size_t begin = 0;
    for (std::size_t end : ends) {
      step_fn(std::span<const Hyper>(groups), all.subspan(begin, end - begin), runtime);
      begin = end;
    }
  }
  // In packing order, so a repeated counter ends at its last (largest) occurrence.
  for (std::size_t i = 0; i < packed.size(); ++i) {
    const std::uintptr_t step_ptr = std::get<12>(packed[i]);
    if (step_ptr != 0) *Ptr<float>(step_ptr) = static_cast<float>(segments[i].step);
  }
  std::get<0>(report) = true;
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

}  // namespace
}  // namespace fusedopt

PYBIND11_MODULE(_C, m) {
  using namespace fusedopt;
  m.doc() = "fusedopt's fused CPU engine (internal: use the fusedopt package)";

  // Hyper-parameter structs, constructed from Python keyword arguments with torch's names.
  py::class_<SgdHyper>(m, "SgdHyper")
      .def(py::init([](double lr, double momentum, double dampening, double weight_decay,
                       bool nesterov, bool maximize) {
             return SgdHyper{lr, momentum, dampening, weight_decay, nesterov, maximize};
           }),
           py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("weight_decay"),
           py::arg("nesterov"), py::arg("maximize"));
  py::class_<AdamHyper>(m, "AdamHyper")
      .def(py::init([](double lr, double beta1, double beta2, double eps, double weight_decay,
                       bool amsgrad, bool maximize, bool decoupled_weight_decay) {
             return AdamHyper{lr,           beta1,   beta2,    eps,
                              weight_decay, amsgrad, maximize, decoupled_weight_decay};
           }),
           py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
           py::arg("weight_decay"), py::arg("amsgrad"), py::arg("maximize"),
           py::arg("decoupled_weight_decay"));
  py::class_<RmspropHyper>(m, "RmspropHyper")
      .def(py::init([](double lr, double alpha, double eps, double weight_decay, double momentum,
                       bool centered, bool maximize) {
             return RmspropHyper{lr, alpha, eps, weight_decay, momentum, centered, maximize};
           }),
           py::arg("lr"), py::arg("alpha"), py::arg("eps"), py::arg("weight_decay"),
           py::arg("momentum"), py::arg("centered"), py::arg("maximize"));
  py::class_<AdagradHyper>(m, "AdagradHyper")
      .def(py::init([](double lr, double lr_decay, double weight_decay,
                       double initial_accumulator_value, double eps, bool maximize) {
             return AdagradHyper{lr,  lr_decay, weight_decay, initial_accumulator_value,
                                 eps, maximize};
           }),
           py::arg("lr"), py::arg("lr_decay"), py::arg("weight_decay"),
           py::arg("initial_accumulator_value"), py::arg("eps"), py::arg("maximize"));

  // step functions: (groups, segments, num_threads, max_norm, norm_type, check, wave_ends,
  // validate_only) -> StepReport (see RunStep); fusedopt::Error surfaces as ValueError.
  // norm_type: 2, 1, or 0 for inf.
  const auto bind_step = [&m](const char* name, auto hyper_tag, auto step_fn) {
    using Hyper = typename decltype(hyper_tag)::type;
    m.def(
        name,
        [step_fn](const std::vector<Hyper>& g, const std::vector<SegmentTuple>& s, int threads,
                  double max_norm, int norm_type, bool check,
                  const std::vector<std::size_t>& wave_ends, bool validate_only) {
          return RunStep(g, s, threads, max_norm, norm_type, check, wave_ends, validate_only,
                         step_fn);
        },
        py::arg("groups"), py::arg("segments"), py::arg("num_threads"),
        py::arg("max_norm") = std::numeric_limits<double>::infinity(), py::arg("norm_type") = 2,
        py::arg("check") = false, py::arg("wave_ends") = std::vector<std::size_t>{},
        py::arg("validate_only") = false);
  };
  bind_step("sgd_step", std::type_identity<SgdHyper>{}, SgdStep);
  bind_step("adam_step", std::type_identity<AdamHyper>{}, AdamStep);
  bind_step("rmsprop_step", std::type_identity<RmspropHyper>{}, RmspropStep);
  bind_step("adagrad_step", std::type_identity<AdagradHyper>{}, AdagradStep);

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
