// fusedopt._C: the fused engine for the Python package. It sees tensors only as integers (data
// pointer, element count, dtype code) that python/fusedopt passes in, so it links neither libtorch
// nor its C++ ABI and one build serves any torch version. The Python side keeps the tensors alive
// for the duration of a call, which lets every compute binding release the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/quantize.h"
#include "fusedopt/runtime.h"
#include "fusedopt/scaler.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"
#include "src/python/algorithm_bindings.h"
#include "src/python/prepared_step.h"
#include "src/python/segment_table.h"

namespace py = pybind11;

namespace fusedopt {

void BindSchedules(py::module_& m);    // schedule_bindings.cc
void BindCheckpoint(py::module_& m);   // checkpoint_bindings.cc
void BindDistributed(py::module_& m);  // distributed_bindings.cc

inline QuantMap MapOf(bool is_signed) {
  return is_signed ? QuantMap::kSigned : QuantMap::kUnsigned;
}

}  // namespace fusedopt

PYBIND11_MODULE(_C, m) {
  using namespace fusedopt;
  m.doc() = "fusedopt's fused CPU engine (internal: use the fusedopt package)";

  // Every algorithm of the registry (src/algos/registry.h): its Hyper struct, its step function
  // and what Python needs to know of its state.
  py::class_<StepReport>(m, "StepReport", "What a step call did (src/python/module.cc)")
      .def_readonly("stepped", &StepReport::stepped)
      .def_readonly("found_inf", &StepReport::found_inf)
      .def_readonly("grad_norm", &StepReport::grad_norm)
      .def_readonly("clip_coef", &StepReport::clip_coef)
      .def_readonly("pending", &StepReport::pending)
      .def_readonly("window_found_inf", &StepReport::window_found_inf);
  // A step prepared for fusedopt._unchanged, which reaches it through the capsule
  // (src/python/prepared_step.h).
  py::class_<PreparedStep>(m, "PreparedStep",
                           "A step with its Hypers and table fixed (src/python/prepared_step.h)")
      .def("capsule",
           [](const PreparedStep& step) {
             // (the capsule lends the pointer: whoever holds it keeps this PreparedStep alive)
             return py::capsule(const_cast<PreparedStepAbi*>(step.abi()), kPreparedStepCapsule);
           })
      .def(
          "bound",
          [](const py::object& self, std::vector<std::uintptr_t> grads, std::vector<int> codes,
             float grad_scale, int num_threads, double max_norm, int norm_type, int clip_rule) {
            if (codes.size() != grads.size())
              throw py::value_error("PreparedStep.bound: grads and grad_dtypes differ in length");
            const auto& step = self.cast<const PreparedStep&>();
            return py::cpp_function([self, &step, grads = std::move(grads),
                                     codes = std::move(codes), grad_scale, num_threads, max_norm,
                                     norm_type, clip_rule] {
              return step({.grads = grads.data(),
                           .grad_dtypes = codes.data(),
                           .count = grads.size(),
                           .grad_scale = grad_scale,
                           .num_threads = num_threads,
                           .max_norm = max_norm,
                           .norm_type = norm_type,
                           .clip_rule = clip_rule});
            });
          },
          py::arg("grads"), py::arg("grad_dtypes"), py::arg("grad_scale"), py::arg("num_threads"),
          py::arg("max_norm") = std::numeric_limits<double>::infinity(), py::arg("norm_type") = 2,
          py::arg("clip_rule") = 0,
          "The step on these gradients as a function of no arguments, returning its StepReport: "
          "the engine called with no Python work but the call, which bench/torch_bench.py times");
  m.attr("algorithms") = BindAlgorithms<algos::All>(m);  // src/python/algorithm_bindings.h

  // 8-bit block-wise states (fusedopt/quantize.h), by address: Python converts states with these
  // (an f32 state loaded into an 8-bit optimizer, a state_dict's f32 view).
  m.attr("quant_block") = kQuantBlock;
  m.attr("min_8bit_size") = kMin8bitSize;
  m.def(
      "dynamic_map", [](bool is_signed) { return DynamicMap(MapOf(is_signed)); }, py::arg("signed"),
      "bitsandbytes' create_dynamic_map(signed): 256 f32 values, ascending.");
  m.def(
      "quantize",
      [](std::uintptr_t x, std::size_t n, bool is_signed, std::uintptr_t codes,
         std::uintptr_t absmax) {
        Quantize(Ptr<const float>(x), n, MapOf(is_signed), Ptr<std::uint8_t>(codes),
                 Ptr<float>(absmax));
      },
      py::arg("x"), py::arg("n"), py::arg("signed"), py::arg("codes"), py::arg("absmax"),
      "Quantizes n f32 values at address x into codes and one absmax per block of quant_block.");
  m.def(
      "dequantize",
      [](std::uintptr_t codes, std::uintptr_t absmax, std::size_t n, bool is_signed,
         std::uintptr_t out) {
        Dequantize(Ptr<const std::uint8_t>(codes), Ptr<const float>(absmax), n, MapOf(is_signed),
                   Ptr<float>(out));
      },
      py::arg("codes"), py::arg("absmax"), py::arg("n"), py::arg("signed"), py::arg("out"),
      "out[i] = map[codes[i]] * absmax[i // quant_block], n f32 values at address out.");

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
  m.def(
      "clip_coefficient",
      [](double norm, double max_norm, int rule) {
        return rule == 1 ? LambClipCoefficient(norm, max_norm) : ClipCoefficient(norm, max_norm);
      },
      py::arg("norm"), py::arg("max_norm"), py::arg("rule") = 0,
      "The factor max_grad_norm scales the gradients by, in f32: rule 0 torch's min(1, max_norm / "
      "(norm + 1e-6)), rule 1 apex FusedLAMB's max_norm / norm when norm > max_norm.");
  m.def(
      "clip_grad_value",
      [](const std::vector<GradTuple>& grads, double clip_value, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        ClipGradValue(buffers, clip_value, runtime);
      },
      "Clamps every gradient element to [-clip_value, clip_value] in place.");
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

  BindSegmentTable(m);
  BindSchedules(m);
  BindCheckpoint(m);
  BindDistributed(m);

  m.def("active_target", &ActiveTargetName);
  m.def("available_targets", &AvailableTargets);
  m.def("force_target", &ForceTarget);
}
