// The metadata record of an optimizer checkpoint, as python/fusedopt/checkpoint.py writes it
// (docs/checkpoints.md): JSON whose values follow that module's encoding — a tuple is
// {"tuple": [...]}, a dict {"dict": [[key, value], ...]} (int keys survive), a non-finite float
// {"float": "inf"}, a tensor {"tensor": "<name in the file>"}. The core Optimizer's checkpoints
// (src/checkpoint/checkpoint.cc) and the libtorch adapter's (src/torch/checkpoint.cc) build theirs
// with these helpers, so a file written by either loads in the other and in Python.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint_file.h"
#include "fusedopt/dtype.h"
#include "fusedopt/hyper.h"
#include "fusedopt/scaler.h"
#include "src/algos/registry.h"

namespace fusedopt::checkpoint_meta {

using Json = nlohmann::json;

inline constexpr int kFormat = 1;  // the metadata's "fusedopt_checkpoint"

// A number as checkpoint.py writes it (JSON has no Inf or NaN).
inline Json EncodeFloat(double v) {
  if (std::isfinite(v)) return v;
  return {{"float", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf")}};
}

// The CheckpointError every refusal of a file raises: the path, then what is wrong.
[[noreturn]] inline void Refuse(const std::string& path, const std::string& what) {
  throw CheckpointError(path + ": " + what);
}

inline double DecodeFloat(const Json& v, const std::string& path, const std::string& what) {
  if (v.is_number()) return v.get<double>();
  if (v.is_object() && v.contains("float") && v["float"].is_string()) {
    const std::string s = v["float"].get<std::string>();
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
    if (s == "nan") return NAN;
  }
  Refuse(path, what + " is " + v.dump() + ", not a number");
}

// The value of `key` in an encoded dict ({"dict": [[k, v], ...]}), or null when absent.
inline const Json* DictGet(const Json& dict, std::string_view key) {
  if (!dict.is_object() || !dict.contains("dict") || !dict["dict"].is_array()) return nullptr;
  for (const Json& kv : dict["dict"]) {
    if (kv.is_array() && kv.size() == 2 && kv[0].is_string() && kv[0].get<std::string>() == key) {
      return &kv[1];
    }
  }
  return nullptr;
}

inline Json EncodeDict(const std::vector<std::pair<std::string, Json>>& items) {
  Json list = Json::array();
  for (const auto& [k, v] : items) list.push_back(Json::array({k, v}));
  return {{"dict", list}};
}

// A Hyper field's value as the group holds it: true/false, a number, or for an enumerated field
// (Field::choices) its name, as the reference's group holds it.
template <class F, class T>
Json EncodeField(const F& field, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value;
  } else if constexpr (std::is_same_v<T, int>) {
    if (!field.choices.empty()) {
      return std::string(field.choices[static_cast<std::size_t>(value)]);
    }
    return EncodeFloat(static_cast<double>(value));
  } else {
    return EncodeFloat(static_cast<double>(value));
  }
}

template <class F, class T>
void DecodeField(const F& field, const Json& v, T& out, const std::string& path,
                 const std::string& what) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) Refuse(path, what + " is " + v.dump() + ", not true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, int>) {
    if (field.choices.empty()) {
      out = static_cast<T>(DecodeFloat(v, path, what));
      return;
    }
    const int code = v.is_string() ? field.ChoiceCode(v.get<std::string>()) : -1;
    if (code < 0) {
      Refuse(path, what + " is " + v.dump() + ", not a " + std::string(field.name) + " name");
    }
    out = code;
  } else {
    out = static_cast<T>(DecodeFloat(v, path, what));
  }
}

// A param group as torch's state_dict holds it: {"dict": [["lr", ..], ["betas", {"tuple": [..]}],
// ..., ["params", [indices]]]}.
template <class Hyper>
Json EncodeGroup(const Hyper& h, const std::vector<std::size_t>& params) {
  std::vector<std::pair<std::string, Json>> items;
  std::apply(
      [&](const auto&... field) {
        auto put = [&](const auto& f) {
          const std::string key(f.GroupKey());
          const Json value = EncodeField(f, h.*(f.member));
          if (!f.InTuple()) {
            items.emplace_back(key, value);
            return;
          }
          auto it = std::find_if(items.begin(), items.end(),
                                 [&](const auto& kv) { return kv.first == key; });
          if (it == items.end()) {
            items.emplace_back(key, Json{{"tuple", Json::array()}});
            it = std::prev(items.end());
          }
          it->second["tuple"].push_back(value);
        };
        (put(field), ...);
      },
      algos::DescriptorOf<Hyper>::kFields);
  items.emplace_back("params", params);
  return EncodeDict(items);
}

// The hyper-parameters of an encoded group, over `base` (keys the file lacks keep its values; a
// None part of a tuple, a Nullable field, too). Refuses a value of the wrong kind.
template <class Hyper>
Hyper DecodeGroup(const Json& group, Hyper base, const std::string& path, std::size_t g) {
  std::apply(
      [&](const auto&... field) {
        auto get = [&](const auto& f) {
          const std::string key(f.GroupKey());
          const Json* v = DictGet(group, key);
          const std::string what = "param_groups[" + std::to_string(g) + "]['" + key + "']" +
                                   (f.InTuple() ? "[" + std::to_string(f.index) + "]" : "");
          if (v != nullptr && f.InTuple()) {
            const Json* parts = v->is_object() && v->contains("tuple") ? &(*v)["tuple"] : v;
            if (!parts->is_array() || parts->size() <= static_cast<std::size_t>(f.index)) {
              Refuse(path, what + ": " + v->dump() + " is not a pair");
            }
            v = &(*parts)[static_cast<std::size_t>(f.index)];
          }
          if (v == nullptr || v->is_null()) return;
          DecodeField(f, *v, base.*(f.member), path, what);
        };
        (get(field), ...);
      },
      algos::DescriptorOf<Hyper>::kFields);
  return base;
}

// torch.amp.GradScaler.state_dict()'s keys, which fusedopt.GradScaler shares.
inline Json EncodeScaler(const LossScaler& s) {
  const LossScalerOptions& o = s.options();
  return EncodeDict({{"scale", EncodeFloat(s.scale())},
                     {"growth_factor", EncodeFloat(o.growth_factor)},
                     {"backoff_factor", EncodeFloat(o.backoff_factor)},
                     {"growth_interval", o.growth_interval},
                     {"_growth_tracker", s.growth_tracker()}});
}

// The scaler of a checkpoint with the saved scale and growth tracker (checked as Restore checks
// them), not yet assigned: the caller assigns it once everything else has been checked too.
inline LossScaler DecodeScaler(const Json* saved, const LossScaler& current,
                               const std::string& path) {
  if (saved == nullptr || saved->is_null())
    Refuse(path, "the checkpoint holds no loss scaler state");
  const Json* scale = DictGet(*saved, "scale");
  const Json* tracker = DictGet(*saved, "_growth_tracker");
  if (scale == nullptr || tracker == nullptr || !tracker->is_number_integer()) {
    Refuse(path, "the loss scaler state lacks scale or _growth_tracker: " + saved->dump());
  }
  LossScaler restored = current;
  try {
    restored.Restore(static_cast<float>(DecodeFloat(*scale, path, "the scaler's scale")),
                     tracker->get<std::int64_t>());
  } catch (const Error& e) {
    Refuse(path, std::string("the loss scaler state: ") + e.what());
  }
  return restored;
}

// A training loop's counters (the `extra` of fusedopt.save_checkpoint), e.g. {"updates": 100}.
using Counters = std::map<std::string, std::int64_t>;

inline Json EncodeCounters(const Counters& counters) {
  std::vector<std::pair<std::string, Json>> items(counters.begin(), counters.end());
  return EncodeDict(items);
}

// The integer entries of an encoded extra dict (others, such as Python's RNG state, are skipped).
inline Counters DecodeCounters(const Json& extra) {
  Counters counters;
  if (!extra.is_object() || !extra.contains("dict") || !extra["dict"].is_array()) return counters;
  for (const Json& kv : extra["dict"]) {
    if (kv.is_array() && kv.size() == 2 && kv[0].is_string() && kv[1].is_number_integer()) {
      counters[kv[0].get<std::string>()] = kv[1].get<std::int64_t>();
    }
  }
  return counters;
}

// The layout record: [[params per group], [[shape, torch dtype name], ...]].
inline Json Layout(const std::vector<std::size_t>& group_sizes,
                   const std::vector<std::pair<std::vector<std::int64_t>, std::string>>& params) {
  Json list = Json::array();
  for (const auto& [shape, dtype] : params) list.push_back(Json::array({shape, dtype}));
  return Json::array({group_sizes, list});
}

// Refuses a saved layout not of the form Layout() gives, or with other group sizes than `here`
// (each param's entry is the caller's to compare).
void CheckLayoutGroups(const std::string& path, const Json& saved, const Json& here);
// "float32 of shape (2, 3)": one param of a layout.
std::string DescribeParam(const Json& param);

// "float32", "bfloat16", "float16": torch's names, as the layout writes dtypes.
inline std::string TorchDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kQ8:
      return "uint8";
  }
  return "?";
}
// "F32", "F16", "BF16", and "U8" for 8-bit codes: the file's dtype names.
inline std::string FileDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8:
      return "U8";
  }
  return "?";
}

// The tensors of a read file by name, each looked up with the checks a loader needs.
class TensorTable {
 public:
  TensorTable(const CheckpointFile& file, std::string path);
  bool Has(const std::string& name) const { return index_.contains(name); }
  // The entry called `name` with `numel` elements of F32, F16 or BF16 (its dtype in *dtype);
  // refuses one that is missing, of another size or another dtype.
  std::span<const std::byte> Floats(const std::string& name, std::size_t numel, DType* dtype) const;
  // Whether the entry called `name` (refused when missing) holds 8-bit codes (U8).
  bool HoldsCodes(const std::string& name) const;
  // The entry called `name`: `numel` U8 codes; refuses one of another size or dtype.
  std::span<const std::byte> Codes(const std::string& name, std::size_t numel) const;
  // A 0-d (or 1-element) F32, F64, I64 or I32 entry as a double: a step count or a scalar state.
  double Scalar(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  const CheckpointEntry& Get(const std::string& name) const;
  const CheckpointFile& file_;
  std::string path_;
  std::map<std::string, std::size_t> index_;
};

// Copies `numel` elements of dtype `from` into `to` of dtype `to_dtype` (rounding to nearest even
// where it narrows, as torch's copy_ does).
void CopyConverting(std::span<const std::byte> from, DType from_dtype, void* to, DType to_dtype,
                    std::size_t numel);

// The parsed metadata of a verified file: refuses one that is not JSON or of another format.
Json ParseMetadata(const CheckpointFile& file, const std::string& path);

}  // namespace fusedopt::checkpoint_meta
