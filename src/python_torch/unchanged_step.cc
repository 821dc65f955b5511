// fusedopt._unchanged: the check that lets a Python step reuse the last step's segment table
// (_pack_unchanged in python/fusedopt/_packing.py), in one C++ call that reads torch's tensors
// directly.
//
// Why C++ and torch's headers: right after a step the engine has streamed every param, grad and
// state through the caches, so the next step's check finds every tensor's metadata cold. Read
// through torch's Python attributes (p.grad, g.data_ptr(), g.shape, ...) that cost ~0.3 ms on
// mobilenet_v1's 83 tensors, a quarter of the step; read here, each value is a few pointer hops.
// This is the one module of the package built against torch's C++ API, so it is bound to the
// torch version it was compiled with (`torch_version`); python/fusedopt/_packing.py uses it only
// under that version and otherwise packs param by param.
//
// LastStep.step goes one call further: where the last step was prepared (_C.PreparedStep), it also
// checks that each param group holds the values the step's Hypers were made from and runs the
// engine itself with the gradients it read (src/python/prepared_step.h), so that the common step
// is one call into C++: no Python lists of addresses, no Python frames between check and engine.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/headeronly/version.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "src/python/prepared_step.h"

namespace {

namespace py = pybind11;

// fusedopt::DType codes of a gradient (include/fusedopt/dtype.h; _tensors.DTYPE_CODES), -1 if none.
int GradDTypeCode(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return 0;
    case at::kHalf:
      return 1;
    case at::kBFloat16:
      return 2;
    default:
      return -1;
  }
}

std::uintptr_t Address(const at::Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr());
}

const at::Tensor& Unpack(py::handle tensor) { return THPVariable_Unpack(tensor.ptr()); }

// The dict's item at key (a borrowed reference), or nullptr; never calls __missing__, as
// defaultdict.get does not.
PyObject* Lookup(py::handle dict, py::handle key) {
  PyObject* item = PyDict_GetItemWithError(dict.ptr(), key.ptr());
  if (item == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return item;
}

// CPython up to 3.11 versions every dict (PEP 509): any insertion, deletion or replacement changes
// its ma_version_tag. Where it does, one read per dict shows that the optimizer's state and each
// param's state dict hold what they held, in place of a lookup per entry (the optimizer's state's
// lookups call torch's Tensor.__hash__): the check of mobilenet_v1's 83 params after another
// optimizer's step took 0.18 ms with lookups, 0.10 ms so. Later versions deprecate the tag; there
// the lookups stand (LastStep's dict_versions=False, which the tests take too).
#if PY_VERSION_HEX < 0x030C0000
constexpr bool kHasDictVersions = true;
std::uint64_t DictVersion(py::handle dict) {
  return reinterpret_cast<PyDictObject*>(dict.ptr())->ma_version_tag;
}
#else
constexpr bool kHasDictVersions = false;
std::uint64_t DictVersion(py::handle) { return 0; }
#endif

// What the last step packed, as _remember (python/fusedopt/_packing.py) hands it over: the same
// facts _segment's cache entries hold, one list each, so that grads() checks them all in one loop.
class LastStep {
 public:
  LastStep(py::dict state, py::list all_params, std::vector<std::size_t> group_sizes,
           std::vector<bool> has_grad, py::list params,
           const std::vector<std::vector<std::int64_t>>& shapes,
           std::vector<std::uintptr_t> param_ptrs, py::list states, py::list entry_dicts,
           py::list entry_keys, py::list entry_tensors, std::vector<std::uintptr_t> entry_ptrs,
           std::vector<std::int64_t> versions, std::vector<std::uintptr_t> grad_slots,
           bool dict_versions, const py::list& frozen, py::object prepared)
      : dict_versions_(dict_versions),
        state_(std::move(state)),
        all_params_(std::move(all_params)),
        group_sizes_(std::move(group_sizes)),
        has_grad_(std::move(has_grad)),
        params_(std::move(params)),
        param_ptrs_(std::move(param_ptrs)),
        states_(std::move(states)),
        entry_dicts_(std::move(entry_dicts)),
        entry_keys_(std::move(entry_keys)),
        entry_tensors_(std::move(entry_tensors)),
        entry_ptrs_(std::move(entry_ptrs)),
        versions_(std::move(versions)),
        grad_slots_(std::move(grad_slots)),
        prepared_(std::move(prepared)) {
    const std::size_t n = params_.size();
    if (has_grad_.size() != all_params_.size() || shapes.size() != n || param_ptrs_.size() != n ||
        states_.size() != n || versions_.size() != n ||
        (!grad_slots_.empty() && grad_slots_.size() != n) ||
        entry_keys_.size() != entry_dicts_.size() || entry_tensors_.size() != entry_dicts_.size() ||
        entry_ptrs_.size() != entry_dicts_.size()) {
      throw std::invalid_argument("fusedopt._unchanged.LastStep: lists of different lengths");
    }
    if (dict_versions_ && !kHasDictVersions) {
      throw std::invalid_argument("fusedopt._unchanged.LastStep: this Python has no dict versions");
    }
    for (py::handle list :
         {py::handle(all_params_), py::handle(params_), py::handle(entry_tensors_)}) {
      for (py::handle t : py::reinterpret_borrow<py::list>(list)) {
        if (!THPVariable_Check(t.ptr()))
          throw std::invalid_argument("fusedopt._unchanged.LastStep: not a tensor");
      }
    }
    shape_ends_.reserve(n);
    for (const std::vector<std::int64_t>& shape : shapes) {
      sizes_.insert(sizes_.end(), shape.begin(), shape.end());
      shape_ends_.push_back(sizes_.size());
    }
    state_version_ = DictVersion(state_);
    for (py::handle d : states_) state_versions_.push_back(d.is_none() ? 0 : DictVersion(d));
    if (prepared_.is_none()) return;
    if (frozen.size() != group_sizes_.size())
      throw std::invalid_argument("fusedopt._unchanged.LastStep: not one frozen group per group");
    for (py::handle group : frozen) {
      auto [keys, values] = group.cast<std::pair<py::tuple, py::tuple>>();
      if (keys.size() != values.size())
        throw std::invalid_argument("fusedopt._unchanged.LastStep: frozen keys and values differ");
      frozen_.emplace_back(std::move(keys), std::move(values));
    }
    py::object capsule = prepared_.attr("capsule")();
    abi_ = static_cast<const fusedopt::PreparedStepAbi*>(
        PyCapsule_GetPointer(capsule.ptr(), fusedopt::kPreparedStepCapsule));
    if (abi_ == nullptr) throw py::error_already_set();
  }

  // This step's gradients as the engine takes them, (addresses, dtype codes) in the packing order,
  // when every fact the last step's packing depended on still holds; otherwise None, and the step
  // packs param by param. `groups`: the optimizer's param_groups, `state`: its state (the dict it
  // had), `place_grad`: with flatten=True, FlatStore.place_grad (moves a new p.grad into its slot).
  py::object Grads(py::handle groups, py::handle state, py::handle place_grad) const {
    std::vector<std::uintptr_t> addresses;
    std::vector<int> codes;
    if (!Collect(groups, state, place_grad, false, addresses, codes)) return py::none();
    return py::make_tuple(py::cast(addresses), py::cast(codes));
  }

  // The whole step, where the last one was prepared: when Grads would return this step's gradients
  // and each group holds the very values its Hyper was made from, the prepared step run on them,
  // as (stepped, found_inf, grad_norm or None); otherwise None (also where the engine refused the
  // call, having changed nothing), and the step takes the ordinary path.
  py::object Step(py::handle groups, py::handle state, py::handle place_grad, double grad_scale,
                  int num_threads, double max_norm, int norm_type, int clip_rule,
                  bool check) const {
    std::vector<std::uintptr_t> addresses;
    std::vector<int> codes;
    if (abi_ == nullptr || params_.empty() ||
        !Collect(groups, state, place_grad, true, addresses, codes)) {
      return py::none();
    }
    const fusedopt::PreparedStepCall call{.grads = addresses.data(),
                                          .grad_dtypes = codes.data(),
                                          .count = addresses.size(),
                                          .grad_scale = static_cast<float>(grad_scale),
                                          .num_threads = num_threads,
                                          .max_norm = max_norm,
                                          .norm_type = norm_type,
                                          .clip_rule = clip_rule,
                                          .check = check};
    fusedopt::PreparedStepOutcome outcome;
    if (!abi_->run(abi_->step, call, outcome)) return py::none();
    return py::make_tuple(
        outcome.stepped, outcome.found_inf,
        outcome.has_grad_norm ? py::object(py::float_(outcome.grad_norm)) : py::object(py::none()));
  }

 private:
  // Grads' check, filling `addresses` and `codes`; with `hypers`, SameHypers too.
  bool Collect(py::handle groups, py::handle state, py::handle place_grad, bool hypers,
               std::vector<std::uintptr_t>& addresses, std::vector<int>& codes) const {
    try {
      if (!SameParams(groups) || (hypers && !SameHypers(groups))) return false;
      Prefetch();
      if (!SameStates(state)) return false;
      addresses.reserve(params_.size());
      codes.reserve(params_.size());
      std::size_t i = 0;  // index into the packed params
      for (std::size_t k = 0; k < has_grad_.size(); ++k) {
        const at::Tensor& p = Unpack(all_params_[k]);
        const at::Tensor& g = p.grad();
        if (g.defined() != has_grad_[k]) return false;
        if (!g.defined()) continue;
        std::optional<std::pair<std::uintptr_t, int>> read = ReadParam(i, p, g, place_grad);
        if (!read) return false;
        addresses.push_back(read->first);
        codes.push_back(read->second);
        ++i;
      }
      for (std::size_t e = 0; e < entry_ptrs_.size(); ++e) {
        if (Address(Unpack(entry_tensors_[e])) != entry_ptrs_[e]) return false;
      }
      return true;
    } catch (const c10::Error&) {
      return false;  // a tensor without storage, ...: the param-by-param path names it
    }
  }

  // Each group (SameParams found a dict) holds the very key and value objects, in order, that it
  // held when the step's Hypers were made (python/fusedopt/_packing.py, _frozen_values: floats,
  // tuples of them, ..., nothing that changes in place), so its Hyper is the same. (Keys equal but
  // not identical fail, and the ordinary path compares them: no Python code runs here.)
  bool SameHypers(py::handle groups) const {
    for (std::size_t gi = 0; gi < frozen_.size(); ++gi) {
      PyObject* group = PyList_GET_ITEM(groups.ptr(), gi);
      const auto& [keys, values] = frozen_[gi];
      if (static_cast<std::size_t>(PyDict_GET_SIZE(group)) != keys.size()) return false;
      Py_ssize_t pos = 0;
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      for (std::size_t i = 0; PyDict_Next(group, &pos, &key, &value); ++i) {
        if (key != PyTuple_GET_ITEM(keys.ptr(), i) || value != PyTuple_GET_ITEM(values.ptr(), i))
          return false;
      }
    }
    return true;
  }

  // The groups' param lists hold the same params, in the same order (user code may edit them in
  // place).
  bool SameParams(py::handle groups) const {
    if (!PyList_Check(groups.ptr()) ||
        static_cast<std::size_t>(PyList_GET_SIZE(groups.ptr())) != group_sizes_.size()) {
      return false;
    }
    std::size_t k = 0;
    for (std::size_t gi = 0; gi < group_sizes_.size(); ++gi) {
      PyObject* group = PyList_GET_ITEM(groups.ptr(), gi);
      if (!PyDict_Check(group)) return false;
      PyObject* list = PyDict_GetItemString(group, "params");  // (a borrowed reference)
      if (list == nullptr || !PyList_Check(list) ||
          static_cast<std::size_t>(PyList_GET_SIZE(list)) != group_sizes_[gi]) {
        return false;
      }
      for (Py_ssize_t j = 0; j < PyList_GET_SIZE(list); ++j, ++k) {
        if (PyList_GET_ITEM(list, j) != PyList_GET_ITEM(all_params_.ptr(), k)) return false;
      }
    }
    return true;
  }

  // The optimizer's state is the same dict, each packed param's state dict is still its entry, and
  // each state tensor the step reads is still its entry.
  bool SameStates(py::handle state) const {
    if (state.ptr() != state_.ptr()) return false;
    if (dict_versions_) {
      if (DictVersion(state_) != state_version_) return false;
      for (std::size_t i = 0; i < states_.size(); ++i) {
        if (!states_[i].is_none() && DictVersion(states_[i]) != state_versions_[i]) return false;
      }
      return true;
    }
    for (std::size_t i = 0; i < states_.size(); ++i) {
      if (Lookup(state_, params_[i]) != (states_[i].is_none() ? nullptr : states_[i].ptr()))
        return false;
    }
    for (std::size_t e = 0; e < entry_tensors_.size(); ++e) {
      if (Lookup(entry_dicts_[e], entry_keys_[e]) != entry_tensors_[e].ptr()) return false;
    }
    return true;
  }

  // Reads the memory the checks read, one hop for all tensors at a time: right after a step the
  // engine has evicted it, and walked tensor by tensor each hop (PyObject -> TensorImpl ->
  // StorageImpl, -> AutogradMeta -> the grad's TensorImpl -> ...) is a cache miss that waits for
  // the one before. Read for all tensors at once, the misses overlap. Plain loads, not prefetch
  // instructions: a CPU may drop a prefetch when its miss buffers are full, a load it must
  // complete. The check of mobilenet_v1's 83 params (and 249 state tensors) right after an AdamW
  // step took 43 us with prefetches, 25 us with loads; after torch's for-loop AdamW step (the
  // bench's neighbour), 95 and 50 us (2-core AMD EPYC, Zen 5). (Keeping the TensorImpls in C++
  // would save the first hop, but its references would make torch.utils.swap_tensors refuse the
  // params, and a swapped param would go unnoticed.)
  void Prefetch() const {
    for (py::handle d : states_) Touch(d.ptr(), 1);
    for (py::handle list : {py::handle(all_params_), py::handle(entry_tensors_)}) {
      for (py::handle t : py::reinterpret_borrow<py::list>(list)) Touch(t.ptr(), 1);
    }
    if (!dict_versions_) {
      for (py::handle d : entry_dicts_) Touch(reinterpret_cast<PyDictObject*>(d.ptr())->ma_keys, 2);
    }
    std::vector<const c10::TensorImpl*> impls;
    impls.reserve(all_params_.size() + entry_tensors_.size());
    for (py::handle list : {py::handle(all_params_), py::handle(entry_tensors_)}) {
      for (py::handle t : py::reinterpret_borrow<py::list>(list)) {
        impls.push_back(Unpack(t).unsafeGetTensorImpl());
        Touch(impls.back(), kImplLines);
      }
    }
    for (const c10::TensorImpl* impl : impls)
      Touch(impl->unsafe_storage().unsafeGetStorageImpl(), kStorageLines);
    for (std::size_t k = 0; k < all_params_.size(); ++k) Touch(impls[k]->autograd_meta(), 2);
    std::vector<const c10::TensorImpl*> grads;
    grads.reserve(all_params_.size());
    for (std::size_t k = 0; k < all_params_.size(); ++k) {
      const at::Tensor& g = Unpack(all_params_[k]).grad();
      if (g.defined()) grads.push_back(g.unsafeGetTensorImpl());
    }
    for (const c10::TensorImpl* impl : grads) Touch(impl, kImplLines);
    for (const c10::TensorImpl* impl : grads)
      Touch(impl->unsafe_storage().unsafeGetStorageImpl(), kStorageLines);
  }

  // Cache lines an object may span: a TensorImpl (176 bytes in torch 2.13), a StorageImpl's fields
  // the data pointer's read takes (the first 2 of its 96 bytes' lines), a small dict's keys table
  // (its first 2), an AutogradMeta's grad_ (at 40 bytes).
  static constexpr int kImplLines = 4;
  static constexpr int kStorageLines = 2;
  static void Touch(const void* object, int lines) {
    if (object == nullptr) return;
    for (int line = 0; line < lines; ++line)
      (void)*(static_cast<const volatile char*>(object) + std::ptrdiff_t{64} * line);
  }

  c10::IntArrayRef Shape(std::size_t i) const {
    const std::size_t begin = i == 0 ? 0 : shape_ends_[i - 1];
    return {sizes_.data() + begin, shape_ends_[i] - begin};
  }

  // Packed param i (p, with gradient g): its gradient's (address, code) if its packing still holds.
  std::optional<std::pair<std::uintptr_t, int>> ReadParam(std::size_t i, const at::Tensor& p,
                                                          const at::Tensor& g,
                                                          py::handle place_grad) const {
    if (Address(p) != param_ptrs_[i] || (versions_[i] >= 0 && p._version() != versions_[i]))
      return std::nullopt;
    if (g.layout() != at::kStrided || !g.device().is_cpu() || !g.has_storage() ||
        !g.is_contiguous() || g.sizes() != Shape(i)) {
      return std::nullopt;
    }
    int code = GradDTypeCode(g.scalar_type());
    if (code < 0) return std::nullopt;
    std::uintptr_t address = Address(g);
    if (!grad_slots_.empty() && address != grad_slots_[i]) {  // flatten=True and a new p.grad
      py::object placed = place_grad(params_[i]);
      const at::Tensor& slot = Unpack(placed);
      address = Address(slot);
      code = GradDTypeCode(slot.scalar_type());
    }
    return std::make_pair(address, code);
  }

  bool dict_versions_;                      // check the state dicts by their versions, not lookups
  py::dict state_;                          // the optimizer's state
  std::uint64_t state_version_ = 0;         // its DictVersion
  py::list all_params_;                     // every group's params, in order
  std::vector<std::size_t> group_sizes_;    // how many of them each group holds
  std::vector<bool> has_grad_;              // per param of all_params_: it had a gradient
  py::list params_;                         // those packed: the ones with a gradient
  std::vector<std::uintptr_t> param_ptrs_;  // per packed param: its data_ptr(),
  std::vector<std::int64_t> sizes_;      // its gradient's shape (all of them, one after the other)
  std::vector<std::size_t> shape_ends_;  // and where that shape ends in sizes_
  py::list states_;                      // the optimizer's state[p] (None: none)
  std::vector<std::uint64_t> state_versions_;  // its DictVersion
  py::list entry_dicts_;                       // each state tensor the step reads: its dict,
  py::list entry_keys_;                        // its key,
  py::list entry_tensors_;                     // the tensor itself
  std::vector<std::uintptr_t> entry_ptrs_;     // and its data_ptr()
  std::vector<std::int64_t> versions_;         // with an f32 master copy, p._version; else -1
  std::vector<std::uintptr_t> grad_slots_;     // flatten=True: where each grad belongs; else empty
  py::object prepared_;                        // the _C.PreparedStep Step runs, or None
  std::vector<std::pair<py::tuple, py::tuple>> frozen_;  // per group: its keys and values then
  const fusedopt::PreparedStepAbi* abi_ = nullptr;       // prepared_'s
};

std::string TorchVersion() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

}  // namespace

PYBIND11_MODULE(_unchanged, m) {
  m.doc() = "The unchanged-step check of fusedopt's Python step, against torch's C++ tensors";
  m.attr("torch_version") = TorchVersion();    // the torch this module was compiled against
  m.attr("dict_versions") = kHasDictVersions;  // LastStep may take dict_versions=True
  py::class_<LastStep>(m, "LastStep")
      .def(py::init<py::dict, py::list, std::vector<std::size_t>, std::vector<bool>, py::list,
                    std::vector<std::vector<std::int64_t>>, std::vector<std::uintptr_t>, py::list,
                    py::list, py::list, py::list, std::vector<std::uintptr_t>,
                    std::vector<std::int64_t>, std::vector<std::uintptr_t>, bool, const py::list&,
                    py::object>(),
           py::arg("state"), py::arg("all_params"), py::arg("group_sizes"), py::arg("has_grad"),
           py::arg("params"), py::arg("shapes"), py::arg("param_ptrs"), py::arg("states"),
           py::arg("entry_dicts"), py::arg("entry_keys"), py::arg("entry_tensors"),
           py::arg("entry_ptrs"), py::arg("versions"), py::arg("grad_slots"),
           py::arg("dict_versions"), py::arg("frozen") = py::list(),
           py::arg("prepared") = py::none())
      .def("grads", &LastStep::Grads, py::arg("groups"), py::arg("state"), py::arg("place_grad"))
      .def("step", &LastStep::Step, py::arg("groups"), py::arg("state"), py::arg("place_grad"),
           py::arg("grad_scale"), py::arg("num_threads"), py::arg("max_norm"), py::arg("norm_type"),
           py::arg("clip_rule"), py::arg("check"));
}
