// The rounds of `fusedopt bench` (runner.cc): the order the impls run in within each round, and the
// statistics the report gives of the kept rounds.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <vector>

#include "src/tool_util/load_monitor.h"

namespace fusedopt::bench {

// min, quartiles and max of per-round ratios num[r] / den[r] (linear interpolation between order
// statistics, as Python's statistics.quantiles(method="inclusive") in bench/torch_bench.py).
nlohmann::json RoundRatioSpread(const std::vector<double>& num, const std::vector<double>& den);

// The load report of the kept rounds (src/tool_util/load_monitor.h).
nlohmann::json LoadReport(const std::vector<tools::RoundLoad>& loads, int discarded);

// The order of the impls in round r: a Williams design (row r of n, or of 2n for an odd n), in
// which every impl runs right after every other one equally often, so no impl is timed only in
// the cache state some particular impl leaves.
std::vector<std::size_t> RoundOrder(std::size_t n, std::size_t r);

}  // namespace fusedopt::bench
