// The option helpers several commands share (command.h): the registry's algorithm names, the
// model shapes and the --clip value.

#include <cmath>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "src/algos/registry.h"
#include "src/tool_util/model_shapes.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {

std::vector<std::string> AlgorithmNames() {
  std::vector<std::string> names;
  algos::All::ForEach([&](auto d) { names.emplace_back(decltype(d)::type::kName); });
  return names;
}

std::vector<std::string> ModelNames() {
  const std::span<const std::string_view> models = tools::ModelNames();
  return {models.begin(), models.end()};
}

void AddShapesOrNumelOptions(CLI::App& parser, std::string& shapes, std::size_t& numel) {
  CLI::Option* shapes_option =
      parser.add_option("--shapes", shapes, "Real per-tensor shapes of a model")
          ->check(CLI::IsMember(ModelNames()));
  CLI::Option* numel_option =
      parser.add_option("--numel", numel, "One flat tensor of N elements")->check(ElementCount());
  shapes_option->excludes(numel_option);
}

double ParseClip(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double value = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(value) || !(value > 0.0)) {
    throw std::invalid_argument("--clip: invalid max norm '" + s + "' (a finite number > 0)");
  }
  return value;
}

}  // namespace fusedopt::cli
