// Golden vectors of every algorithm of the registry (tests/golden/<lowercase kTorchName>.json,
// written by tools/make_golden.py from the algorithm's reference: torch.optim, the reference's pip
// package, or its formulas in torch ops under tools/; each file says which) and of the test-only
// algorithms (tests/algos/registry.h, their files beside them): the fp32 fused kernels on the
// default (best) SIMD target must match the reference's single-tensor path within 1e-6 relative
// (floor 1e-6·max|ref| per buffer) at the checkpoints of each file (steps 1, 5 and 20; the long
// runs also 100). Each group dict is parsed by the descriptor's fields (torch's group keys), each
// state key found among its kStates. LAMB needs no looser tolerance despite torch's non-IEEE sqrt
// and the trust ratio: its worst error is 8.7e-8 of that metric (torch 2.13.0+cpu wheel, AVX3 and
// AVX2). Adafactor (torch.optim.Adafactor, 100 steps, 1-D, 2-D and 3-D params) is held to the same
// bound but cannot match bit for bit: its torch.norm and mean reductions sum in an order of their
// own (vectorized, blocked), ours sum in double in a fixed order, so ‖p‖, the factors and ‖U‖
// differ in their last f32 bits. Whether they match bit for bit is printed once at the end, for
// information only.
//
// The inputs are not stored: initial params and gradients are rebuilt from the generator's integer
// hash. One test per case, registered at start-up from the JSON files, named
// Golden.<Algorithm>_<case>.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#ifdef FOPT_TEST_ALGORITHMS_DIR
#  include "tests/algos/registry.h"
#endif

namespace fusedopt {
namespace {

using nlohmann::json;

constexpr double kRtol = 1e-6;
// Absolute floor of the tolerance: kBufferAtolFactor * max|ref| over the buffer.
constexpr double kBufferAtolFactor = 1e-6;

// ---- Inputs: the generator's hash (tools/make_golden.py), bit for bit. ----

std::uint32_t Mix32(std::uint32_t x) {  // lowbias32
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

std::uint32_t Hash32(std::uint32_t seed, std::uint32_t tensor, std::uint32_t step,
                     std::uint32_t index) {
  std::uint32_t x = Mix32(seed);
  x = Mix32(x ^ tensor);
  x = Mix32(x ^ step);
  return Mix32(x ^ index);
}

// Step 0: the initial param; step s >= 1: the gradient of global step s.
std::vector<float> MakeTensor(std::uint32_t seed, std::uint32_t tensor, std::uint32_t step,
                              std::size_t n, double scale) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t k = Hash32(seed, tensor, step, static_cast<std::uint32_t>(i)) % 20001u;
    out[i] = static_cast<float>((static_cast<double>(k) - 10000.0) / 10000.0 * scale);
  }
  return out;
}

// ---- The glue, from the descriptors (src/algos/): hyper-parameters from torch's group dicts, each
// Hyper field under its param_group key (Field::GroupKey, betas[0] for beta1), state slots by
// torch's state keys (kStates), the step by the Hyper type. What a reference does beyond its
// groups is below the parser. ----

// The Hyper of one of torch's group dicts.
template <class D>
typename D::Hyper ParseFields(const json& g) {
  typename D::Hyper h;
  algos::ForEachField<D>([&](const auto& f) {
    using T = std::remove_reference_t<decltype(h.*f.member)>;
    const std::string key(f.GroupKey());
    if (f.optional && !g.contains(key)) return;  // the Hyper's default
    const json& value = f.InTuple() ? g.at(key).at(f.index) : g.at(key);
    if (f.nullable && value.is_null()) return;  // Adafactor's eps1 None: f32's eps, the default
    if constexpr (std::is_same_v<T, int>) {
      if (!f.choices.empty()) {  // BertAdam's schedule, by name
        h.*f.member = f.ChoiceCode(value.template get<std::string>());
        return;
      }
    }
    h.*f.member = value.template get<T>();
  });
  return h;
}

// lion-pytorch: the group dicts have lr, betas and weight_decay (no maximize). With the
// constructor's decoupled_weight_decay=True, lion-pytorch divides weight_decay by the constructor's
// lr before it multiplies the group lr; LionHyper::weight_decay is the factor of lr, so it is
// wd / constructor lr here (as the Python class passes it).
void FromConstructor(LionHyper& h, const json& ctor) {
  if (ctor.value("decoupled_weight_decay", false)) {
    h.weight_decay /= ctor.value("lr", 1e-4);  // lion-pytorch's default lr
  }
}
template <class Hyper>
void FromConstructor(Hyper& /*h*/, const json& /*ctor*/) {}

template <class D>
typename D::Hyper ParseGroup(const json& g, const json& c) {
  typename D::Hyper h = ParseFields<D>(g);
  FromConstructor(h, c.at("constructor"));
  return h;
}

// The state slot of torch's state key, or -1.
template <class D>
int Slot(const std::string& key) {
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if (key == D::kStates[static_cast<std::size_t>(slot)]) return slot;
  }
  return -1;
}

// The value a fresh state slot starts from (the descriptor's: zero, or from the group).
template <class D>
float InitialState(const typename D::Hyper& h, int slot, const json& /*c*/) {
  return D::InitialState(h, slot);
}
// torch fills every Adagrad sum with the constructor's value, whatever a group dict says.
template <>
float InitialState<algos::Adagrad>(const AdagradHyper& /*h*/, int /*slot*/, const json& c) {
  return static_cast<float>(c.at("constructor").value("initial_accumulator_value", 0.0));
}

// tools/lamb_reference.py: the case-level max_grad_norm is global (the group copies are ignored).
// The clipping runs as the engine's pre-pass: the global norm over the tensors that have a grad
// this step, its LAMB coefficient folded into grad_scale, then the step.
void PrePass(std::span<const LambHyper> /*g*/, std::span<Segment> s, const json& c) {
  const PrePassResult pre = GradPrePass(
      s, {.max_norm = c.at("max_grad_norm").get<double>(), .clip_rule = ClipRule::kLamb});
  ASSERT_FALSE(pre.non_finite) << "the golden gradients are finite";
}
template <class Hyper>
void PrePass(std::span<const Hyper> /*g*/, std::span<Segment> /*s*/, const json& /*c*/) {}

template <class D>
void StepCase(std::span<const typename D::Hyper> groups, std::span<Segment> segments,
              const json& c) {
  PrePass(groups, segments, c);
  if (testing::Test::HasFatalFailure()) return;
  FusedStep(groups, std::span<const Segment>(segments));
}

// ---- Comparison and the informational summary. ----

struct Summary {
  int cases = 0;
  long buffers = 0;
  long buffers_bitwise = 0;
  long elements = 0;
  long elements_differing = 0;
  double max_rel_err = 0.0;       // |a - r| / max(|r|, floor / rtol): the asserted metric
  double max_pure_rel_err = 0.0;  // |a - r| / |r| over r != 0, no floor
  std::int64_t max_ulps = 0;
  std::string worst_case;  // buffer and element of max_rel_err
};

std::map<std::string, Summary>& Summaries() {
  static std::map<std::string, Summary> summaries;
  return summaries;
}

std::int64_t UlpDistance(float a, float b) {
  auto ordered = [](float f) {
    const auto i = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(f));
    return i < 0 ? std::int64_t{INT32_MIN} - i : i;
  };
  return std::abs(ordered(a) - ordered(b));
}

std::string Describe(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", static_cast<double>(f),
                std::bit_cast<std::uint32_t>(f));
  return buf;
}

// Compares one buffer, records it in the summary and fails with the worst element if out of
// tolerance.
void CompareBuffer(const std::string& what, const json& ref_json, const std::vector<float>& got,
                   Summary& summary) {
  const auto ref = ref_json.get<std::vector<double>>();
  ASSERT_EQ(ref.size(), got.size()) << what << ": size";
  double max_abs_ref = 0.0;
  for (double r : ref) max_abs_ref = std::max(max_abs_ref, std::abs(r));
  // Elements with |r| below floor_scale are held to the absolute floor instead of kRtol·|r|.
  const double floor_scale = max_abs_ref * kBufferAtolFactor / kRtol;
  double worst = -1.0;
  std::size_t worst_i = 0;
  long failing = 0;
  long differing = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const auto r = static_cast<float>(ref[i]);  // exact: the file holds float32 values
    const float a = got[i];
    if (std::bit_cast<std::uint32_t>(r) == std::bit_cast<std::uint32_t>(a)) continue;
    ++differing;
    const double diff = std::abs(static_cast<double>(a) - static_cast<double>(r));
    const double scale = std::max(std::abs(static_cast<double>(r)), floor_scale);
    double err = scale > 0.0 ? diff / scale : (diff > 0.0 ? INFINITY : 0.0);
    if (std::isnan(a)) err = INFINITY;
    if (err > kRtol) ++failing;
    if (r != 0.0f) {
      summary.max_pure_rel_err = std::max(summary.max_pure_rel_err, diff / std::abs(double{r}));
    }
    summary.max_ulps = std::max(summary.max_ulps, std::isnan(a) ? INT64_MAX : UlpDistance(a, r));
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  ++summary.buffers;
  summary.elements += static_cast<long>(ref.size());
  summary.elements_differing += differing;
  if (differing == 0) ++summary.buffers_bitwise;
  if (worst > summary.max_rel_err) {
    summary.max_rel_err = worst;
    summary.worst_case = what + " [" + std::to_string(worst_i) + "]";
  }
  if (failing > 0) {
    const auto r = static_cast<float>(ref[worst_i]);
    ADD_FAILURE() << what << ": " << failing << " of " << ref.size()
                  << " elements out of tolerance; worst element [" << worst_i << "]: expected "
                  << Describe(r) << ", got " << Describe(got[worst_i]) << ", |diff| "
                  << std::abs(static_cast<double>(got[worst_i]) - r) << ", relative error " << worst
                  << " (rtol " << kRtol << ", floor " << max_abs_ref * kBufferAtolFactor << ")";
  }
}

// Replays one case of an algorithm file and compares every checkpoint.
template <class D>
void RunCase(const std::string& algorithm, const json& header, const json& c) {
  using Hyper = typename D::Hyper;
  ForceTarget("");  // default (best) target, whatever an earlier test forced
  const std::string name = algorithm + "_" + c.at("name").get<std::string>();
  SCOPED_TRACE(name + " on target " + ActiveTargetName());
  Summary& summary = Summaries()[algorithm];
  ++summary.cases;

  const auto seed = c.at("seed").get<std::uint32_t>();
  const auto sizes = c.at("sizes").get<std::vector<std::size_t>>();
  const auto group_of = c.at("group_of").get<std::vector<std::uint32_t>>();
  const auto has_grad = c.at("has_grad").get<std::vector<std::vector<bool>>>();
  const double param_scale = header.at("inputs").at("param_scale").get<double>();
  const double grad_scale = header.at("inputs").at("grad_scale").get<double>();
  const int steps = header.at("steps").get<int>();
  const std::size_t n = sizes.size();
  ASSERT_EQ(group_of.size(), n);
  // Segment::rows from the case's shapes: AdamP's size(0) of a tensor of more than one dimension;
  // a factored algorithm's (Adafactor's) size(-2), with cols its size(-1).
  std::vector<std::size_t> rows(n, 0);
  std::vector<std::size_t> cols(n, 0);
  if (c.contains("shapes")) {
    const auto shapes = c.at("shapes").get<std::vector<std::vector<std::size_t>>>();
    ASSERT_EQ(shapes.size(), n);
    for (std::size_t t = 0; t < n; ++t) {
      const auto& shape = shapes[t];
      if (shape.size() <= 1) continue;
      if constexpr (algos::Factored<D>) {
        rows[t] = shape[shape.size() - 2];
        cols[t] = shape.back();
      } else {
        rows[t] = shape[0];
      }
    }
  }
  // The state slots tensor t keeps, and how many elements each (a factored algorithm's by shape).
  const auto slots_of = [&](std::size_t t, const Hyper& h) -> unsigned {
    if constexpr (algos::Factored<D>) {
      static_cast<void>(h);
      Segment shape;
      shape.rows = rows[t];
      return D::SegmentStates(shape);
    } else {
      return RequiredStates(h);
    }
  };
  const auto state_size = [&](std::size_t t, int slot) -> std::size_t {
    if constexpr (algos::Factored<D>) {
      if (rows[t] == 0) return sizes[t];
      const std::size_t batch = sizes[t] / (rows[t] * cols[t]);
      return batch * (D::kStateShapes[static_cast<std::size_t>(slot)] == algos::Shape::kRows
                          ? rows[t]
                          : cols[t]);
    } else {
      static_cast<void>(slot);
      return sizes[t];
    }
  };
  ASSERT_EQ(has_grad.size(), static_cast<std::size_t>(steps));

  std::vector<Hyper> groups;
  for (const json& g : c.at("groups")) groups.push_back(ParseGroup<D>(g, c));

  // Params and every state slot the tensor's group needs, allocated up front. torch creates the
  // state lazily with zeros (Adagrad: eagerly, filled with initial_accumulator_value); SGD's
  // momentum buffer is written, not read, on the tensor's step 1.
  std::vector<std::vector<float>> params(n);
  std::vector<std::vector<float>> state[kMaxStates];
  std::vector<std::int64_t> count(n, 0);
  for (std::size_t t = 0; t < n; ++t) {
    params[t] = MakeTensor(seed, static_cast<std::uint32_t>(t), 0, sizes[t], param_scale);
    const unsigned required = slots_of(t, groups.at(group_of[t]));
    for (int slot = 0; slot < kMaxStates; ++slot) {
      state[slot].resize(n);
      if ((required >> slot & 1u) == 0) continue;
      const float init = InitialState<D>(groups.at(group_of[t]), slot, c);
      state[slot][t].assign(state_size(t, slot), init);
    }
  }
  const std::vector<std::vector<float>> initial_params = params;
  // The scalar states (NAdam's mu_product): torch's 0-d tensors, created with the rest of the
  // state.
  constexpr std::size_t kScalars = algos::NumScalarStates<D>();
  std::vector<std::array<float, kMaxScalars>> scalars(n);
  if constexpr (kScalars > 0) {
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t k = 0; k < kScalars; ++k) {
        scalars[t][k] = D::InitialScalar(groups.at(group_of[t]), static_cast<int>(k));
      }
    }
  }
  // Index of torch's key among the scalar states, or -1.
  const auto scalar_slot = [](const std::string& key) {
    if constexpr (kScalars > 0) {
      for (std::size_t k = 0; k < kScalars; ++k) {
        if (key == D::kScalarStates[k]) return static_cast<int>(k);
      }
    }
    return -1;
  };

  std::size_t next_checkpoint = 0;
  const json& checkpoints = c.at("checkpoints");
  for (int step = 1; step <= steps; ++step) {
    std::vector<std::vector<float>> grads(n);
    std::vector<Segment> segments;
    for (std::size_t t = 0; t < n; ++t) {
      if (!has_grad[step - 1][t]) continue;
      grads[t] = MakeTensor(seed, static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(step),
                            sizes[t], grad_scale);
      Segment s;
      s.param = params[t].data();
      s.grad = grads[t].data();
      for (int slot = 0; slot < kMaxStates; ++slot) {
        if (!state[slot][t].empty()) s.state[slot] = state[slot][t].data();
      }
      for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &scalars[t][k];
      s.numel = sizes[t];
      s.rows = rows[t];
      s.cols = cols[t];
      s.group = group_of[t];
      s.step = ++count[t];
      segments.push_back(s);
    }
    StepCase<D>(groups, segments, c);
    if (testing::Test::HasFatalFailure()) return;

    if (next_checkpoint >= checkpoints.size() ||
        checkpoints[next_checkpoint].at("step").get<int>() != step) {
      continue;
    }
    const json& ck = checkpoints[next_checkpoint++];
    const std::string at = name + " after step " + std::to_string(step) + ", ";
    for (std::size_t t = 0; t < n; ++t) {
      const std::string tensor =
          "tensor " + std::to_string(t) + " (" + std::to_string(sizes[t]) + ")";
      CompareBuffer(at + tensor + " param", ck.at("params").at(t), params[t], summary);
      if (count[t] == 0) {
        EXPECT_EQ(params[t], initial_params[t]) << at << tensor << ": changed without a grad";
      }
      const json& st = ck.at("state").at(t);
      const unsigned required = slots_of(t, groups[group_of[t]]);
      if (st.contains("step")) {
        EXPECT_EQ(st.at("step").get<std::int64_t>(), count[t]) << at << tensor << ": torch's step";
      } else if (algos::CountsSteps<D>()) {  // SGD, Lion and LARS keep no step
        EXPECT_EQ(count[t], 0) << at << tensor << ": torch has no state";
      }
      unsigned seen = 0;
      for (const auto& [key, value] : st.items()) {
        if (key == "step" || value.is_null()) continue;
        if (const int k = scalar_slot(key); k >= 0) {
          CompareBuffer(at + tensor + " " + key, value, {scalars[t][static_cast<std::size_t>(k)]},
                        summary);
          continue;
        }
        const int slot = Slot<D>(key);
        ASSERT_GE(slot, 0) << at << tensor << ": unknown state key " << key;
        ASSERT_NE(required >> slot & 1u, 0u)
            << at << tensor << ": torch has " << key << ", RequiredStates does not";
        seen |= 1u << slot;
        CompareBuffer(at + tensor + " " + key, value, state[slot][t], summary);
      }
      if (count[t] > 0) {
        EXPECT_EQ(seen, required) << at << tensor << ": torch's state keys vs RequiredStates";
      }
    }
  }
  EXPECT_EQ(next_checkpoint, checkpoints.size()) << name << ": checkpoints not reached";
}

// ---- The group-key mapping itself (descriptor.h's Field): what the parser above relies on. ----

// Each descriptor's fields: distinct names, each torch key either a whole value once or a tuple
// whose parts are indices 0, 1, ... once each; only int fields are held by name.
TEST(GoldenFields, EveryGroupKeyIsOneValueOrOneTuple) {
  algos::All::ForEach([](auto d) {
    using D = typename decltype(d)::type;
    SCOPED_TRACE(D::kTorchName);
    std::map<std::string, std::vector<int>> parts;  // key -> the indices of its fields
    std::vector<std::string> names;
    algos::ForEachField<D>([&](const auto& f) {
      using T = std::remove_reference_t<decltype(std::declval<typename D::Hyper&>().*f.member)>;
      names.emplace_back(f.name);
      parts[std::string(f.GroupKey())].push_back(f.index);
      if (!f.choices.empty()) {
        EXPECT_TRUE((std::is_same_v<T, int>)) << f.name;
      }
    });
    std::sort(names.begin(), names.end());
    EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "a name twice";
    for (const auto& [key, indices] : parts) {
      if (indices.size() == 1 && indices[0] < 0) continue;  // a whole value
      for (std::size_t i = 0; i < indices.size(); ++i) {
        EXPECT_EQ(indices[i], static_cast<int>(i)) << key << ": tuple parts out of order";
      }
    }
  });
}

// ---- Registration: one test per case, from the files. ----

class GoldenTest : public testing::Test {
 public:
  using Runner = void (*)(const std::string&, const json&, const json&);
  GoldenTest(Runner run, std::string algorithm, const json* header, const json* c)
      : run_(run), algorithm_(std::move(algorithm)), header_(header), case_(c) {}
  void TestBody() override { run_(algorithm_, *header_, *case_); }

 private:
  Runner run_;
  std::string algorithm_;
  const json* header_;
  const json* case_;
};

class FileErrorTest : public testing::Test {
 public:
  explicit FileErrorTest(std::string message) : message_(std::move(message)) {}
  void TestBody() override { FAIL() << message_; }

 private:
  std::string message_;
};

// Prints the informational summary once, after all tests.
class SummaryPrinter : public testing::Environment {
 public:
  void TearDown() override {
    if (Summaries().empty()) return;
    std::printf("[ Golden   ] torch %s (%s)%s vs fusedopt fp32 on target %s:\n",
                torch_version.c_str(), cpu_capability.c_str(),
                exact_sqrt ? " with a correctly rounded sqrt (diagnostic)" : "",
                ActiveTargetName().c_str());
    bool all_bitwise = true;
    for (const auto& [algo, s] : Summaries()) {
      all_bitwise = all_bitwise && s.buffers_bitwise == s.buffers;
      std::printf(
          "[ Golden   ]   %-8s %2d cases: %ld/%ld buffers bitwise equal, %ld/%ld elements differ, "
          "max rel err %.3g (without the floor %.3g), max %lld ulp\n",
          algo.c_str(), s.cases, s.buffers_bitwise, s.buffers, s.elements_differing, s.elements,
          s.max_rel_err, s.max_pure_rel_err, static_cast<long long>(s.max_ulps));
      if (s.max_rel_err > 0.0)
        std::printf("[ Golden   ]            worst: %s\n", s.worst_case.c_str());
    }
    std::printf("[ Golden   ] bitwise equal to torch: %s (informational, not asserted)\n",
                all_bitwise ? "YES" : "NO");
    if (!all_bitwise && sqrt_off > 0) {
      std::printf(
          "[ Golden   ] note: this torch's sqrt is not correctly rounded (%ld of %ld probe "
          "values differ from IEEE sqrt), so Adam/RMSprop/Adagrad cannot be bitwise; see "
          "tools/make_golden.py --exact-sqrt\n",
          sqrt_off, sqrt_values);
    }
  }
  std::string torch_version;
  std::string cpu_capability;
  bool exact_sqrt = false;
  long sqrt_off = -1;
  long sqrt_values = 0;
};

struct GoldenFile {
  std::string file;       // <dir>/<lowercase torch name>.json
  std::string algorithm;  // the reference's class name, as the file says it
  std::string generator;  // what writes the file
  GoldenTest::Runner run;
};

// FOPT_GOLDEN_DIR in the environment overrides the compiled-in directory (for the --exact-sqrt
// diagnostic of tools/make_golden.py).
std::string GoldenDir() {
  const char* env = std::getenv("FOPT_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : FOPT_GOLDEN_DIR;
}

// One file per descriptor of the registry, in its order, in GoldenDir(); then one per test-only
// algorithm (tests/algos/registry.h) beside it in tests/algos/.
std::vector<GoldenFile> Files() {
  std::vector<GoldenFile> files;
  const auto add = [&](const std::string& dir, const std::string& generator) {
    return [&files, dir, generator](auto d) {
      using D = typename decltype(d)::type;
      std::string file = D::kTorchName;
      for (char& ch : file) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      // A test-only algorithm's generator is tests/algos/make_<kName>_golden.py.
      const std::string writer = generator.empty()
                                     ? "tests/algos/make_" + std::string(D::kName) + "_golden.py"
                                     : generator;
      files.push_back({dir + "/" + file + ".json", D::kTorchName, writer, &RunCase<D>});
    };
  };
  algos::All::ForEach(add(GoldenDir(), "tools/make_golden.py"));
#ifdef FOPT_TEST_ALGORITHMS_DIR
  test_algos::All::ForEach(add(FOPT_TEST_ALGORITHMS_DIR, ""));
#endif
  return files;
}

// The parsed files live for the whole run: the registered tests point into them.
std::vector<json>& Documents() {
  static std::vector<json> docs;
  return docs;
}

bool RegisterGoldenTests() {
  auto* printer = new SummaryPrinter;
  testing::AddGlobalTestEnvironment(printer);  // gtest takes ownership
  const std::vector<GoldenFile> files = Files();
  Documents().reserve(files.size());
  for (const GoldenFile& f : files) {
    const std::string& path = f.file;
    std::string error;
    json doc;
    std::ifstream in(path);
    if (!in) {
      error = "cannot open " + path + " (regenerate with .venv/bin/python " + f.generator + ")";
    } else {
      try {
        doc = json::parse(in);
        if (doc.value("algorithm", "") != f.algorithm) error = path + ": wrong algorithm";
        if (!doc.contains("cases") || !doc["cases"].is_array()) error = path + ": no cases";
      } catch (const json::exception& e) {
        error = path + ": " + e.what();
      }
    }
    if (!error.empty()) {
      testing::RegisterTest("Golden", (f.algorithm + "_file").c_str(), nullptr, nullptr, __FILE__,
                            __LINE__,
                            [error]() -> testing::Test* { return new FileErrorTest(error); });
      continue;
    }
    printer->torch_version = doc.value("torch_version", "?");
    printer->cpu_capability = doc.value("cpu_capability", "?");
    printer->exact_sqrt = doc.value("exact_sqrt_diagnostic", false);
    if (doc.contains("torch_sqrt")) {
      printer->sqrt_off = doc["torch_sqrt"].value("not_correctly_rounded", -1L);
      printer->sqrt_values = doc["torch_sqrt"].value("values", 0L);
    }
    const json& stored = Documents().emplace_back(std::move(doc));
    for (const json& c : stored.at("cases")) {
      const std::string test_name = f.algorithm + "_" + c.value("name", "unnamed");
      testing::RegisterTest(
          "Golden", test_name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
          [run = f.run, algorithm = f.algorithm, header = &stored, c = &c]() -> testing::Test* {
            return new GoldenTest(run, algorithm, header, c);
          });
    }
  }
  return true;
}

[[maybe_unused]] const bool kRegistered = RegisterGoldenTests();

}  // namespace
}  // namespace fusedopt
