// _C.write_checkpoint / _C.read_checkpoint: the checkpoint container
// (include/fusedopt/checkpoint_file.h) for python/fusedopt/checkpoint.py. Tensors travel as (name,
// dtype, shape, data pointer, bytes), and the caller keeps them alive for the call; a read file's
// data section is exposed through the buffer protocol, so torch.frombuffer(memoryview(f),
// dtype=torch.uint8) views it without a copy. Both release the GIL while they work. A file that is
// not a valid checkpoint, or a bad argument, raises ValueError; a failed read or write raises
// OSError with its errno (28 for ENOSPC, 27 for EFBIG, ...).
//
// _C.checkpoint_name / prepare_checkpoint_dir / list_checkpoints / drop_old_checkpoints /
// latest_checkpoint: a training run's checkpoint folder (src/checkpoint/checkpoint_dir.h), the one
// policy fusedopt.Trainer shares with the C++ Trainer and `fusedopt train --dist`.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint_file.h"
#include "src/checkpoint/checkpoint_dir.h"

namespace py = pybind11;

namespace fusedopt {

namespace {

using TensorTuple =
    std::tuple<std::string, std::string, std::vector<std::int64_t>, std::uintptr_t, std::size_t>;

}  // namespace

void BindCheckpoint(py::module_& m) {
  // Local to this module, and tried before pybind11's own (which would make a system_error a
  // RuntimeError).
  // NOLINTNEXTLINE(performance-unnecessary-value-param): pybind11's translator signature
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CheckpointError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::system_error& e) {
      // OSError(errno, message): Python picks the subclass (FileNotFoundError, ...) and sets
      // .errno.
      PyErr_SetObject(PyExc_OSError, py::make_tuple(e.code().value(), e.what()).ptr());
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::class_<CheckpointFile>(
      m, "CheckpointFile", py::buffer_protocol(),
      "A verified checkpoint file: .metadata (str), .tensors (list of (name, dtype, "
      "shape, offset, nbytes)), and the data section as a 1-D uint8 buffer")
      .def_readonly("metadata", &CheckpointFile::metadata)
      .def_property_readonly(
          "tensors",
          [](const CheckpointFile& f) {
            py::list out;
            for (const CheckpointEntry& e : f.tensors) {
              out.append(py::make_tuple(e.name, e.dtype, py::cast(e.shape), e.offset, e.nbytes));
            }
            return out;
          },
          "(name, dtype, shape, offset, nbytes) per tensor, in the order of their data")
      .def_property_readonly(
          "nbytes", [](const CheckpointFile& f) { return f.data.size(); },
          "Bytes in the data section")
      .def_buffer([](CheckpointFile& f) {
        return py::buffer_info(f.data.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(f.data.size())}, {py::ssize_t{1}});
      });

  m.def(
      "write_checkpoint",
      [](const std::string& path, const std::string& metadata,
         const std::vector<TensorTuple>& tensors) {
        std::vector<CheckpointTensor> list;
        list.reserve(tensors.size());
        for (const auto& [name, dtype, shape, data, nbytes] : tensors) {
          if (data == 0 && nbytes != 0)
            throw std::invalid_argument("write_checkpoint: tensor '" + name +
                                        "': a null data pointer");
          // NOLINTNEXTLINE(performance-no-int-to-ptr): a data_ptr() that Python passes as an int
          list.push_back({name, dtype, shape, {reinterpret_cast<const std::byte*>(data), nbytes}});
        }
        py::gil_scoped_release release;
        WriteCheckpointFile(path, metadata, list);
      },
      py::arg("path"), py::arg("metadata"), py::arg("tensors"),
      "Writes a checkpoint file durably (temporary file, fsync, rename, fsync of the directory). "
      "tensors: "
      "(name, dtype, shape, data pointer, nbytes) of C-contiguous tensors, kept alive by the "
      "caller.");
  m.def(
      "read_checkpoint",
      [](const std::string& path, std::size_t max_header_bytes) {
        CheckpointFile file;
        {
          py::gil_scoped_release release;
          file = ReadCheckpoint(path, max_header_bytes);
        }
        return file;
      },
      py::arg("path"), py::arg("max_header_bytes") = kMaxCheckpointHeaderBytes,
      "Reads and verifies a checkpoint file (format, offsets, checksum), or where no file is, the "
      "shard set saved at path (assembled); ValueError says what is wrong.");
  m.def("checkpoint_layout_hash", &LayoutHash, py::arg("layout_json"),
        "The metadata's layout_hash: XXH3-64 of the layout record's compact JSON, 16 hex digits.");

  m.def("checkpoint_name", &checkpoint_dir::CheckpointName, py::arg("dir"), py::arg("step"),
        "dir/step-NNNNNNNN.safetensors: the checkpoint of `step` in a training run's folder.");
  m.def(
      "prepare_checkpoint_dir",
      [](const std::string& dir, const std::string& name) {
        py::gil_scoped_release release;
        checkpoint_dir::PrepareCheckpointDir(dir, name);
      },
      py::arg("dir"), py::arg("name"),
      "Makes the folder, checks that it takes a file now and removes the temporary files of "
      "saves a killed run left; OSError(errno, \"<name> is not writable: <why>\") otherwise.");
  m.def(
      "list_checkpoints",
      [](const std::string& dir) {
        std::map<std::int64_t, std::string> found;
        {
          py::gil_scoped_release release;
          found = checkpoint_dir::ListCheckpoints(dir);
        }
        return found;
      },
      py::arg("dir"),
      "{step: path} of the checkpoints in dir (files, and shard sets by the path they were saved "
      "at); {} if dir does not exist.");
  m.def(
      "drop_old_checkpoints",
      [](const std::string& dir, int keep) {
        if (keep < 0) {
          throw std::invalid_argument("drop_old_checkpoints: keep must be >= 0, got " +
                                      std::to_string(keep));
        }
        py::gil_scoped_release release;
        checkpoint_dir::DropOldCheckpoints(dir, keep);
      },
      py::arg("dir"), py::arg("keep"),
      "Removes all but the newest `keep` checkpoints in dir, a file or a whole shard set each "
      "(keep 0: none).");
  m.def(
      "latest_checkpoint",
      [](const std::string& dir) {
        std::vector<std::string> skipped;
        std::optional<std::string> latest;
        {
          py::gil_scoped_release release;
          latest = checkpoint_dir::LatestCheckpoint(dir, &skipped);
        }
        return std::make_pair(latest, skipped);
      },
      py::arg("dir"),
      "(path of the newest checkpoint in dir that verifies, or None; [\"path: why\" for each newer "
      "one that does not]).");
}

}  // namespace fusedopt
