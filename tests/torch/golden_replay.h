// Replaying tests/golden/*.json through a fusedopt::pt class: the generator's inputs
// (tools/make_golden.py, bit for bit as tests/golden_test.cc rebuilds them), every case for its
// steps, compared after each checkpoint step as tests/golden_test.cc compares the core: |a − r| <=
// 1e-6·max|r| per buffer, and the step counts. ParseOptions, StateTensor and StateStep map a
// class's options and state to the reference's group dicts and state keys.
#pragma once

#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fusedopt/pt/optim.h"
#include "src/algos/registry.h"
#include "tests/torch/test_util.h"

namespace fusedopt::pt::test {

using nlohmann::json;

template <class State>
State* StateOf(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(p.unsafeGetTensorImpl());
  return it == opt.state().end() ? nullptr : static_cast<State*>(it->second.get());
}

// The generator's inputs (tools/make_golden.py; tests/golden_test.cc), bit for bit.
inline std::uint32_t Mix32(std::uint32_t x) {  // lowbias32
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Step 0: the initial param; step s >= 1: the gradient of global step s.
inline torch::Tensor MakeTensor(std::uint32_t seed, std::uint32_t tensor, std::uint32_t step,
                                std::size_t n, double scale) {
  torch::Tensor out = torch::empty({static_cast<std::int64_t>(n)}, torch::kFloat);
  float* data = out.data_ptr<float>();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h =
        Mix32(Mix32(Mix32(Mix32(seed) ^ tensor) ^ step) ^ static_cast<std::uint32_t>(i));
    data[i] = static_cast<float>((static_cast<double>(h % 20001u) - 10000.0) / 10000.0 * scale);
  }
  return out;
}

inline json LoadGolden(const std::string& file) {
  const char* env = std::getenv("FOPT_GOLDEN_DIR");
  const std::filesystem::path dir = env != nullptr && *env != '\0'
                                        ? std::filesystem::path(env)
                                        : std::filesystem::path(FOPT_GOLDEN_DIR);
  std::ifstream in(dir / file);
  if (!in) {
    ADD_FAILURE() << "cannot open " << (dir / file).string();
    return json::object();
  }
  return json::parse(in);
}

// lion-pytorch's group dict. Its constructor's decoupled_weight_decay=True divides weight_decay by
// the constructor's lr; LionOptions::weight_decay is the factor of lr, so a user passes wd / lr.
inline LionOptions ParseOptions(const json& g, const json& c, LionOptions /*tag*/) {
  double weight_decay = g.at("weight_decay").get<double>();
  const json& ctor = c.at("constructor");
  if (ctor.value("decoupled_weight_decay", false)) weight_decay /= ctor.value("lr", 1e-4);
  return LionOptions(g.at("lr").get<double>())
      .betas({g.at("betas").at(0).get<double>(), g.at("betas").at(1).get<double>()})
      .weight_decay(weight_decay);
}

// apex FusedLAMB's group dict; the case's max_grad_norm is the global one.
inline LambOptions ParseOptions(const json& g, const json& c, LambOptions /*tag*/) {
  return LambOptions(g.at("lr").get<double>())
      .betas({g.at("betas").at(0).get<double>(), g.at("betas").at(1).get<double>()})
      .eps(g.at("eps").get<double>())
      .weight_decay(g.at("weight_decay").get<double>())
      .bias_correction(g.at("bias_correction").get<bool>())
      .adam_w_mode(g.at("adam_w_mode").get<bool>())
      .grad_averaging(g.at("grad_averaging").get<bool>())
      .use_nvlamb(g.at("use_nvlamb").get<bool>())
      .max_grad_norm(c.at("max_grad_norm").get<double>());
}

// A generic class's options (optim.h, HyperOptions) from torch's group dict: each field of the
// descriptor under its torch group key (algos::Field: betas[1] for beta2, a name for BertAdam's
// schedule), absent or None where the field says the reference may leave it so.
template <class Hyper>
HyperOptions<Hyper> ParseOptions(const json& g, const json& /*c*/, HyperOptions<Hyper> /*tag*/) {
  Hyper h;
  algos::ForEachField<algos::DescriptorOf<Hyper>>([&](const auto& field) {
    using T = std::remove_reference_t<decltype(h.*field.member)>;
    const std::string key(field.GroupKey());
    if (field.optional && !g.contains(key)) return;
    const json& value = field.InTuple() ? g.at(key).at(field.index) : g.at(key);
    if (field.nullable && value.is_null()) return;  // Adafactor's eps1 None: the default
    if constexpr (std::is_same_v<T, int>) {
      if (!field.choices.empty() && value.is_string()) {
        h.*field.member = field.ChoiceCode(value.template get<std::string>());
        return;
      }
    }
    h.*field.member = value.template get<T>();
  });
  return h;
}

template <class Hyper>
const torch::Tensor* StateTensor(HyperParamState<Hyper>& s, const std::string& key) {
  return &s.state(key);
}
template <class Hyper>
std::optional<std::int64_t> StateStep(const HyperParamState<Hyper>& s) {
  return s.step();
}

template <class State>
bool KeepsStepAlways(const State& /*s*/) {
  return false;
}
template <class Hyper>
bool KeepsStepAlways(const HyperParamState<Hyper>& /*s*/) {
  return true;
}

// |a − r| <= 1e-6·max|r| over the buffer (tests/golden_test.cc's metric).
inline void ExpectGoldenClose(const torch::Tensor& actual, const json& ref,
                              const std::string& what) {
  const auto r = ref.get<std::vector<double>>();
  ASSERT_EQ(static_cast<std::size_t>(actual.numel()), r.size()) << what;
  const std::vector<double> a = Doubles(actual);
  double scale = 0.0;
  double worst = 0.0;
  std::size_t at = 0;
  for (const double x : r) scale = std::max(scale, std::abs(x));
  for (std::size_t k = 0; k < r.size(); ++k) {
    const double diff =
        std::isnan(a[k]) ? std::numeric_limits<double>::infinity() : std::abs(a[k] - r[k]);
    if (diff > worst) {
      worst = diff;
      at = k;
    }
  }
  EXPECT_LE(worst, 1e-6 * scale) << what << "[" << at << "]: " << a[at] << " vs golden " << r[at]
                                 << " (max |golden| " << scale << ")";
}

template <class Optimizer, class Options, class State>
void ReplayGoldens(const std::string& file) {
  const json doc = LoadGolden(file);
  ASSERT_TRUE(doc.contains("cases")) << file;
  const int steps = doc.at("steps").get<int>();
  const double param_scale = doc.at("inputs").at("param_scale").get<double>();
  const double grad_scale = doc.at("inputs").at("grad_scale").get<double>();
  int cases = 0;
  for (const json& c : doc.at("cases")) {
    SCOPED_TRACE(file + " case " + c.at("name").get<std::string>());
    ++cases;
    const auto seed = c.at("seed").get<std::uint32_t>();
    const auto sizes = c.at("sizes").get<std::vector<std::size_t>>();
    const auto group_of = c.at("group_of").get<std::vector<std::size_t>>();
    const auto has_grad = c.at("has_grad").get<std::vector<std::vector<bool>>>();
    // A case's shapes (AdamP's and Adafactor's params of more than one dimension), or 1-D tensors
    // of its sizes.
    std::vector<std::vector<std::int64_t>> shapes;
    for (const std::size_t n : sizes) shapes.push_back({static_cast<std::int64_t>(n)});
    if (c.contains("shapes")) shapes = c.at("shapes").get<std::vector<std::vector<std::int64_t>>>();
    std::vector<Options> options;
    for (const json& g : c.at("groups")) options.push_back(ParseOptions(g, c, Options{}));

    std::vector<torch::Tensor> params;
    std::vector<std::vector<torch::Tensor>> by_group(options.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      params.push_back(MakeTensor(seed, static_cast<std::uint32_t>(t), 0, sizes[t], param_scale)
                           .reshape(shapes[t])
                           .requires_grad_(true));
      by_group.at(group_of[t]).push_back(params.back());
    }
    std::vector<torch::optim::OptimizerParamGroup> param_groups;
    for (std::size_t g = 0; g < options.size(); ++g) param_groups.emplace_back(by_group[g]);
    Optimizer opt(param_groups, options[0]);
    // The groups exactly as the reference's dicts (not merged with the defaults).
    for (std::size_t g = 0; g < options.size(); ++g) {
      static_cast<Options&>(opt.param_groups()[g].options()) = options[g];
    }

    std::vector<std::int64_t> count(sizes.size(), 0);
    std::size_t next = 0;
    const json& checkpoints = c.at("checkpoints");
    for (int step = 1; step <= steps; ++step) {
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        if (has_grad.at(step - 1).at(t)) {
          params[t].mutable_grad() =
              MakeTensor(seed, static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(step),
                         sizes[t], grad_scale)
                  .reshape(shapes[t]);
          ++count[t];
        } else {
          params[t].mutable_grad() = torch::Tensor();
        }
      }
      opt.step();
      if (next >= checkpoints.size() || checkpoints[next].at("step").get<int>() != step) continue;
      const json& ck = checkpoints[next++];
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const std::string what =
            "after step " + std::to_string(step) + ", tensor " + std::to_string(t);
        ExpectGoldenClose(params[t], ck.at("params").at(t), what + " param");
        const json& st = ck.at("state").at(t);
        auto* state = StateOf<State>(opt, params[t]);
        if (count[t] == 0) {
          EXPECT_EQ(state, nullptr) << what << ": state without a step";
          continue;
        }
        if (st.empty()) continue;  // torch.optim.SGD without momentum: an empty dict, here none
        ASSERT_NE(state, nullptr) << what;
        for (const auto& [key, value] : st.items()) {
          if (key == "step") {
            EXPECT_EQ(StateStep(*state), value.template get<std::int64_t>()) << what;
            continue;
          }
          const torch::Tensor* tensor = StateTensor(*state, key);
          ASSERT_NE(tensor, nullptr) << what << ": no state " << key;
          ExpectGoldenClose(*tensor, value, what + " " + key);
        }
        // Lion keeps no step count, as lion-pytorch; the generic classes keep one for every
        // algorithm, torch.optim.SGD-like LARS's too (theirs, not the reference's).
        if (!st.contains("step") && !KeepsStepAlways(*state)) {
          EXPECT_FALSE(StateStep(*state).has_value()) << what;
        }
      }
    }
    EXPECT_EQ(next, checkpoints.size()) << "checkpoints not reached";
  }
  EXPECT_GE(cases, 5) << file;
}

}  // namespace fusedopt::pt::test
