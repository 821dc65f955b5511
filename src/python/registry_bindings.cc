// What python/fusedopt reads of each algorithm's descriptor (src/algos/<algo>.h) beyond its step:
// the hyper-parameter fields with torch's param_group keys (the one group-key mapping, Field in
// src/algos/descriptor.h), the reference's class name and whether torch's state counts steps, added
// to _C.algorithms[name] (bound in module.cc), and each Hyper's initial_state(slot), so the Python
// classes build their Hyper and states and name themselves without a table of their own.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string_view>
#include <type_traits>

#include "src/algos/registry.h"

namespace py = pybind11;

namespace fusedopt {

namespace {

// One Field as a dict: {"name", "key", "index" (-1: the whole value), "kind" ("bool", "number" or
// "choice": an int held by name), "optional", "nullable", "choices" (the names, by code)}.
template <class Hyper, class T>
py::dict FieldEntry(const algos::Field<Hyper, T>& field) {
  py::list choices;
  for (std::string_view choice : field.choices)
    choices.append(py::str(choice.data(), choice.size()));
  py::dict entry;
  entry["name"] = field.name;
  const std::string_view key = field.GroupKey();
  entry["key"] = py::str(key.data(), key.size());
  entry["index"] = field.index;
  entry["kind"] = std::is_same_v<T, bool> ? "bool" : (field.choices.empty() ? "number" : "choice");
  entry["optional"] = field.optional;
  entry["nullable"] = field.nullable;
  entry["choices"] = py::tuple(choices);
  return entry;
}

}  // namespace

void BindRegistry(py::module_& m) {
  py::dict algorithms = m.attr("algorithms");
  algos::All::ForEach([&](auto descriptor) {
    using A = typename decltype(descriptor)::type;
    py::list fields;
    algos::ForEachField<A>([&](const auto& field) { fields.append(FieldEntry(field)); });
    py::dict entry = algorithms[A::kName];
    // h.initial_state(slot): the value a fresh state slot starts from (the engine's InitialState).
    py::reinterpret_borrow<py::class_<typename A::Hyper>>(entry["hyper"])
        .def(
            "initial_state",
            [](const typename A::Hyper& h, int slot) { return A::InitialState(h, slot); },
            py::arg("slot"));
    entry["fields"] = py::tuple(fields);
    entry["torch_name"] = A::kTorchName;
    entry["counts_steps"] = algos::CountsSteps<A>();
  });
}

}  // namespace fusedopt
