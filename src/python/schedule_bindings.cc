// Python bindings of include/fusedopt/schedule.h: _C.Schedule (callable: s(step) -> lr) and one
// factory per torch scheduler, with torch's keyword names and defaults.
// python/fusedopt/schedules.py wraps them for users; fusedopt::Error surfaces as ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/error.h"
#include "fusedopt/schedule.h"

namespace py = pybind11;

namespace fusedopt {

void BindSchedules(py::module_& m) {
  py::class_<Schedule>(m, "Schedule",
                       "An lr schedule as a pure function of the step: s(step) is the lr after "
                       "`step` scheduler steps (torch's last_epoch; 0 = before the first step).")
      .def("__call__", &Schedule::Lr, py::arg("step"))
      .def("lr", &Schedule::Lr, py::arg("step"))
      .def("momentum", &Schedule::Momentum, py::arg("step"),
           "The cycled momentum (SGD momentum / Adam beta1) at `step`; only if has_momentum.")
      .def_property_readonly("has_momentum", &Schedule::has_momentum)
      .def("__repr__", &Schedule::Describe);

  m.def("constant", &ConstantSchedule, py::arg("lr"));
  m.def("constant_lr", &ConstantLr, py::arg("base_lr"), py::arg("factor") = 1.0 / 3,
        py::arg("total_iters") = 5);
  m.def("linear_lr", &LinearLr, py::arg("base_lr"), py::arg("start_factor") = 1.0 / 3,
        py::arg("end_factor") = 1.0, py::arg("total_iters") = 5);
  m.def("cosine_annealing_lr", &CosineAnnealingLr, py::arg("base_lr"), py::arg("T_max"),
        py::arg("eta_min") = 0.0);
  m.def("step_lr", &StepLr, py::arg("base_lr"), py::arg("step_size"), py::arg("gamma") = 0.1);
  m.def("multi_step_lr", &MultiStepLr, py::arg("base_lr"), py::arg("milestones"),
        py::arg("gamma") = 0.1);
  m.def("exponential_lr", &ExponentialLr, py::arg("base_lr"), py::arg("gamma"));
  m.def("polynomial_lr", &PolynomialLr, py::arg("base_lr"), py::arg("total_iters") = 5,
        py::arg("power") = 1.0);
  m.def(
      "one_cycle_lr",
      [](double max_lr, std::int64_t total_steps, double pct_start,
         const std::string& anneal_strategy, bool cycle_momentum, double base_momentum,
         double max_momentum, double div_factor, double final_div_factor, bool three_phase) {
        if (anneal_strategy != "cos" && anneal_strategy != "linear") {
          throw Error("OneCycleLr: invalid anneal_strategy: '" + anneal_strategy +
                      "' (must be 'cos' or 'linear')");
        }
        OneCycleOptions o;
        o.max_lr = max_lr;
        o.total_steps = total_steps;
        o.pct_start = pct_start;
        o.anneal_cos = anneal_strategy == "cos";
        o.cycle_momentum = cycle_momentum;
        o.base_momentum = base_momentum;
        o.max_momentum = max_momentum;
        o.div_factor = div_factor;
        o.final_div_factor = final_div_factor;
        o.three_phase = three_phase;
        return OneCycleLr(o);
      },
      py::arg("max_lr"), py::arg("total_steps"), py::arg("pct_start") = 0.3,
      py::arg("anneal_strategy") = "cos", py::arg("cycle_momentum") = true,
      py::arg("base_momentum") = 0.85, py::arg("max_momentum") = 0.95, py::arg("div_factor") = 25.0,
      py::arg("final_div_factor") = 1e4, py::arg("three_phase") = false);
  m.def("sequential_lr", &SequentialLr, py::arg("schedulers"), py::arg("milestones"));
  m.def("warmup_cosine", &WarmupCosine, py::arg("base_lr"), py::arg("warmup_steps"),
        py::arg("total_steps"), py::arg("min_lr") = 0.0, py::arg("warmup_start_factor") = 1.0 / 3);
}

}  // namespace fusedopt
