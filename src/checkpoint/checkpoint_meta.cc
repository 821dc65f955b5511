// The parts of src/checkpoint/checkpoint_meta.h that are not templates.

#include "src/checkpoint/checkpoint_meta.h"

#include <cstring>

namespace fusedopt::checkpoint_meta {

std::string DescribeParam(const Json& param) {
  std::string shape = "(";
  for (std::size_t i = 0; i < param[0].size(); ++i) {
    shape += (i ? ", " : "") + param[0][i].dump();
  }
  if (param[0].size() == 1) shape += ",";
  return param[1].get<std::string>() + " of shape " + shape + ")";
}

void CheckLayoutGroups(const std::string& path, const Json& saved, const Json& here) {
  bool well_formed =
      saved.is_array() && saved.size() == 2 && saved[0].is_array() && saved[1].is_array();
  for (std::size_t i = 0; well_formed && i < saved[1].size(); ++i) {
    const Json& p = saved[1][i];
    well_formed = p.is_array() && p.size() == 2 && p[0].is_array() && p[1].is_string();
    for (std::size_t d = 0; well_formed && d < p[0].size(); ++d) {
      well_formed = p[0][d].is_number_unsigned();
    }
  }
  if (!well_formed) Refuse(path, "the checkpoint's layout is malformed: " + saved.dump());
  if (saved[0] != here[0] || saved[1].size() != here[1].size()) {
    Refuse(path, "the checkpoint's optimizer has param groups of " + saved[0].dump() +
                     " params; this one has " + here[0].dump());
  }
}

TensorTable::TensorTable(const CheckpointFile& file, std::string path)
    : file_(file), path_(std::move(path)) {
  for (std::size_t i = 0; i < file.tensors.size(); ++i) index_[file.tensors[i].name] = i;
}

const CheckpointEntry& TensorTable::Get(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) Refuse(path_, "the checkpoint has no tensor " + name);
  return file_.tensors[it->second];
}

std::span<const std::byte> TensorTable::Floats(const std::string& name, std::size_t numel,
                                               DType* dtype) const {
  const CheckpointEntry& e = Get(name);
  bool known = false;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (e.dtype == FileDTypeName(t)) *dtype = t, known = true;
  }
  if (!known) {
    Refuse(path_, name + " is " + e.dtype + "; F32, F16 or BF16 expected");
  }
  if (e.nbytes != numel * DTypeSize(*dtype)) {
    Refuse(path_, name + " has " + std::to_string(e.nbytes / DTypeSize(*dtype)) +
                      " elements; this optimizer's has " + std::to_string(numel));
  }
  return std::span<const std::byte>(file_.data).subspan(e.offset, e.nbytes);
}

bool TensorTable::HoldsCodes(const std::string& name) const { return Get(name).dtype == "U8"; }

std::span<const std::byte> TensorTable::Codes(const std::string& name, std::size_t numel) const {
  const CheckpointEntry& e = Get(name);
  if (e.dtype != "U8") Refuse(path_, name + " is " + e.dtype + "; U8 (8-bit codes) expected");
  if (e.nbytes != numel) {
    Refuse(path_, name + " has " + std::to_string(e.nbytes) +
                      " codes; this optimizer's state has " + std::to_string(numel) + " elements");
  }
  return std::span<const std::byte>(file_.data).subspan(e.offset, e.nbytes);
}

double TensorTable::Scalar(const std::string& name) const {
  const CheckpointEntry& e = Get(name);
  const std::byte* p = file_.data.data() + e.offset;
  auto read = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, p, sizeof v);
    return static_cast<double>(v);
  };
  if (e.dtype == "F32" && e.nbytes == 4) return read(0.0f);
  if (e.dtype == "F64" && e.nbytes == 8) return read(0.0);
  if (e.dtype == "I64" && e.nbytes == 8) return read(std::int64_t{0});
  if (e.dtype == "I32" && e.nbytes == 4) return read(std::int32_t{0});
  Refuse(path_,
         name + " is not one number (" + e.dtype + ", " + std::to_string(e.nbytes) + " bytes)");
}

void CopyConverting(std::span<const std::byte> from, DType from_dtype, void* to, DType to_dtype,
                    std::size_t numel) {
  if (from_dtype == to_dtype) {
    if (numel != 0) std::memcpy(to, from.data(), from.size());
    return;
  }
  for (std::size_t i = 0; i < numel; ++i) {
    StoreFromF32(to, to_dtype, i, LoadAsF32(from.data(), from_dtype, i));
  }
}

Json ParseMetadata(const CheckpointFile& file, const std::string& path) {
  Json meta = Json::parse(file.metadata, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded()) Refuse(path, "the checkpoint's metadata is not JSON");
  const Json version = meta.is_object() ? meta.value("fusedopt_checkpoint", Json()) : Json();
  if (version != kFormat) {
    Refuse(path, "not a fusedopt checkpoint of format " + std::to_string(kFormat) + " (it says " +
                     version.dump() + ")");
  }
  return meta;
}

}  // namespace fusedopt::checkpoint_meta
