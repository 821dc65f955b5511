// The doctor's trace reader (doctor.h: DoctorOptionsFromTrace, docs/trace-format.md).
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/runtime.h"
#include "src/doctor/doctor.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using tools::CheckedAdd;
using tools::Num;
using tools::TrimmedMean;

namespace {

// Trimmed mean (report_util.h) of the durations (µs in the trace) of `pid`'s complete events called
// `name` whose args.step is in `steps`, in ms. Empty `steps`: every non-warm-up `step` span, whose
// indices are added to `steps` (so the optimizer spans of those steps can be picked next).
std::optional<double> TypicalSpanMs(const nlohmann::json& events, int pid, const std::string& name,
                                    std::set<std::int64_t>& steps, bool collect) {
  std::vector<double> ms;
  for (const nlohmann::json& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || e.value("name", "") != name) continue;
    if (!e.contains("pid") || !e["pid"].is_number_integer() || e["pid"].get<std::int64_t>() != pid)
      continue;
    const std::string event = "trace: a '" + name + "' event of pid " + std::to_string(pid);
    const nlohmann::json args = e.value("args", nlohmann::json::object());
    if (!args.is_object()) throw std::invalid_argument(event + " has args that are not an object");
    if (!e.contains("dur") || !e["dur"].is_number())
      throw std::invalid_argument(event + " has no numeric dur");
    if (!(e["dur"].get<double>() >= 0.0))
      throw std::invalid_argument(event + " has a negative dur " + e["dur"].dump());
    if (args.contains("warmup") && !args["warmup"].is_boolean())
      throw std::invalid_argument(event + " has args.warmup " + args["warmup"].dump() +
                                  ", not true or false");
    const std::int64_t step = args.contains("step") && args["step"].is_number_integer()
                                  ? args["step"].get<std::int64_t>()
                                  : -1;
    if (collect) {
      if (args.contains("warmup") && args["warmup"].get<bool>()) continue;
      steps.insert(step);
    } else if (!steps.contains(step)) {
      continue;
    }
    ms.push_back(e["dur"].get<double>() / 1000.0);
  }
  if (ms.empty()) return std::nullopt;
  return TrimmedMean(ms);
}

const nlohmann::json& Required(const nlohmann::json& obj, const std::string& key,
                               const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null())
    throw std::invalid_argument("trace: " + where + "." + key + " is missing");
  return obj[key];
}

// A number (or null: `fallback`) from otherData, checked.
double NumberOr(const nlohmann::json& other, const std::string& key, double fallback) {
  if (!other.contains(key) || other[key].is_null()) return fallback;
  if (!other[key].is_number())
    throw std::invalid_argument("trace: otherData." + key +
                                " is not a number: " + other[key].dump());
  return other[key].get<double>();
}

// The pid of each implementation name (otherData.impls maps pid strings to names).
std::map<std::string, int> ImplPids(const nlohmann::json& other) {
  const nlohmann::json& impls = Required(other, "impls", "otherData");
  if (!impls.is_object()) throw std::invalid_argument("trace: otherData.impls is not an object");
  std::map<std::string, int> pids;
  for (const auto& [pid, name] : impls.items()) {
    if (!name.is_string())
      throw std::invalid_argument("trace: otherData.impls." + pid + " is not a name");
    int value = 0;
    const auto [end, error] = std::from_chars(pid.data(), pid.data() + pid.size(), value);
    if (error != std::errc() || end != pid.data() + pid.size())
      throw std::invalid_argument("trace: otherData.impls has a non-numeric pid '" + pid + "'");
    pids[name.get<std::string>()] = value;
  }
  return pids;
}

struct ImplTimes {
  double step_ms;
  double optimizer_ms;
};

ImplTimes TimesOf(const nlohmann::json& events, const std::string& impl, int pid) {
  std::set<std::int64_t> steps;
  const std::string who = " of impl " + impl + " (pid " + std::to_string(pid) + ")";
  const std::optional<double> step = TypicalSpanMs(events, pid, "step", steps, true);
  if (!step) throw std::invalid_argument("trace: no non-warm-up 'step' span" + who);
  const std::optional<double> opt = TypicalSpanMs(events, pid, "optimizer", steps, false);
  if (!opt) throw std::invalid_argument("trace: no 'optimizer' span in a non-warm-up step" + who);
  return {*step, *opt};
}

}  // namespace

DoctorOptions DoctorOptionsFromTrace(const nlohmann::json& trace) {
  if (!trace.is_object()) throw std::invalid_argument("trace: not a JSON object");
  const nlohmann::json& other = Required(trace, "otherData", "trace");
  const nlohmann::json& events = Required(trace, "traceEvents", "trace");
  if (!events.is_array()) throw std::invalid_argument("trace: traceEvents is not an array");

  // The one format version this reader knows (docs/trace-format.md): a later one may mean
  // something else by the same fields.
  const nlohmann::json& version = Required(other, "fusedopt_trace", "otherData");
  if (version != 1) {
    throw std::invalid_argument("trace: otherData.fusedopt_trace is " + version.dump() +
                                ", a format version this doctor does not read (it reads 1)");
  }
  DoctorOptions o;
  const nlohmann::json& optimizer = Required(other, "optimizer", "otherData");
  if (!optimizer.is_string())
    throw std::invalid_argument("trace: otherData.optimizer is not a string");
  o.optimizer = optimizer.get<std::string>();
  const nlohmann::json& numels = Required(other, "param_numels", "otherData");
  if (!numels.is_array() || numels.empty())
    throw std::invalid_argument("trace: otherData.param_numels is not a non-empty array");
  std::size_t total = 0;
  for (const nlohmann::json& n : numels) {
    if (!n.is_number_unsigned() || n.get<std::size_t>() == 0) {
      throw std::invalid_argument("trace: otherData.param_numels has a bad entry " + n.dump() +
                                  " (element counts are whole numbers > 0)");
    }
    o.numels.push_back(n.get<std::size_t>());
    total = CheckedAdd(total, o.numels.back(), "trace: otherData.param_numels: the sum");
  }
  // param_dtype is the dtype of the params and their states; dtype is the run's (autocast) one.
  // The first given wins; each given one must be a name (CheckedDType checks which).
  bool dtype_given = false;
  for (const char* key : {"param_dtype", "dtype"}) {
    if (!other.contains(key) || other[key].is_null()) continue;
    if (!other[key].is_string()) {
      throw std::invalid_argument("trace: otherData." + std::string(key) +
                                  " is not a string: " + other[key].dump());
    }
    if (!dtype_given) o.dtype = other[key].get<std::string>();
    dtype_given = true;
  }
  o.weight_decay = NumberOr(other, "weight_decay", o.weight_decay);
  o.momentum = NumberOr(other, "momentum", 0.0);
  if (other.contains("nesterov") && !other["nesterov"].is_null()) {
    if (!other["nesterov"].is_boolean()) {
      throw std::invalid_argument("trace: otherData.nesterov is not true or false: " +
                                  other["nesterov"].dump());
    }
    o.nesterov = other["nesterov"].get<bool>();
  }
  if (other.contains("max_grad_norm") && !other["max_grad_norm"].is_null())
    o.clip = NumberOr(other, "max_grad_norm", 0.0);
  const double threads = NumberOr(other, "threads", 0.0);
  if (!(threads >= 0.0 && threads <= kMaxThreads && threads == std::floor(threads))) {
    throw std::invalid_argument("trace: otherData.threads must be a whole number in 0.." +
                                std::to_string(kMaxThreads) + ", got " + Num(threads));
  }
  o.threads = static_cast<int>(threads);

  const std::map<std::string, int> pids = ImplPids(other);
  for (const char* impl : {"torch", "foreach", "torch_fused", "fused"}) {
    if (!pids.contains(impl)) continue;
    o.impl = impl;
    break;
  }
  if (o.impl.empty())
    throw std::invalid_argument(
        "trace: otherData.impls names none of torch, foreach, "
        "torch_fused, fused");
  const ImplTimes times = TimesOf(events, o.impl, pids.at(o.impl));
  o.step_ms = times.step_ms;
  o.optimizer_ms = times.optimizer_ms;
  o.optimizer_ms_source = "trace";
  if (o.impl != "fused" && pids.contains("fused"))
    o.trace_fused_step_ms = TimesOf(events, "fused", pids.at("fused")).step_ms;
  return o;
}

}  // namespace fusedopt::doctor
