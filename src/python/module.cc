// fusedopt._C: the fused engine for the Python package. It sees tensors only as integers (data
// pointer, element count, dtype code) that python/fusedopt passes in, so it links neither libtorch
// nor its C++ ABI and one build serves any torch version. The Python side keeps the tensors alive
// for the duration of a call, which lets every compute binding release the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace py = pybind11;

namespace fusedopt {
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
                                std::int64_t>;   // step, when there is no counter (SGD)
using GradTuple = std::tuple<std::uintptr_t, std::size_t, int>;  // data, numel, dtype code

// Addresses come from torch's data_ptr(); 0 stands for "none".
template <class T>
T* Ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr)
}

std::vector<Segment> ToSegments(const std::vector<SegmentTuple>& packed) {
  std::vector<Segment> segments(packed.size());
  for (std::size_t i = 0; i < packed.size(); ++i) {
    const auto& [param, grad, gd, grad_scale, s0, s1, s2, master, numel, pd, sd, group, step_ptr,
                 step] = packed[i];
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
    // torch keeps the count in an f32 tensor; the step being taken is one more.
    s.step = step_ptr != 0 ? static_cast<std::int64_t>(*Ptr<const float>(step_ptr)) + 1 : step;
    s.grad_scale = grad_scale;
  }
  return segments;
}

// Runs one fused step over every segment, then advances the step counters (only once the step
// has succeeded, so a rejected call changes nothing).
template <class Hyper, class StepFn>
void RunStep(const std::vector<Hyper>& groups, const std::vector<SegmentTuple>& packed,
             int num_threads, StepFn step_fn) {
  const std::vector<Segment> segments = ToSegments(packed);
  {
    py::gil_scoped_release release;
    Runtime runtime(num_threads);
    step_fn(std::span<const Hyper>(groups), std::span<const Segment>(segments), runtime);
  }
  for (std::size_t i = 0; i < packed.size(); ++i) {
    const std::uintptr_t step_ptr = std::get<12>(packed[i]);
    if (step_ptr != 0) *Ptr<float>(step_ptr) = static_cast<float>(segments[i].step);
  }
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

  // step functions: (groups, segments, num_threads); fusedopt::Error surfaces as ValueError.
  m.def("sgd_step", [](const std::vector<SgdHyper>& g, const std::vector<SegmentTuple>& s,
                       int threads) { RunStep(g, s, threads, SgdStep); });
  m.def("adam_step", [](const std::vector<AdamHyper>& g, const std::vector<SegmentTuple>& s,
                        int threads) { RunStep(g, s, threads, AdamStep); });
  m.def("rmsprop_step", [](const std::vector<RmspropHyper>& g, const std::vector<SegmentTuple>& s,
                           int threads) { RunStep(g, s, threads, RmspropStep); });
  m.def("adagrad_step", [](const std::vector<AdagradHyper>& g, const std::vector<SegmentTuple>& s,
                           int threads) { RunStep(g, s, threads, AdagradStep); });

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

  m.def("active_target", &ActiveTargetName);
  m.def("available_targets", &AvailableTargets);
  m.def("force_target", &ForceTarget);
}
