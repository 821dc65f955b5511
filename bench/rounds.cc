#include "bench/rounds.h"

#include <algorithm>

namespace fusedopt::bench {

using tools::RoundLoad;

nlohmann::json RoundRatioSpread(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < num.size(); ++r) ratios.push_back(num[r] / den[r]);
  std::sort(ratios.begin(), ratios.end());
  const auto at = [&](double q) {
    const double pos = q * static_cast<double>(ratios.size() - 1);
    const auto lo = static_cast<std::size_t>(pos);
    const std::size_t hi = std::min(lo + 1, ratios.size() - 1);
    return ratios[lo] + (pos - static_cast<double>(lo)) * (ratios[hi] - ratios[lo]);
  };
  return {
      {"min", at(0.0)}, {"q1", at(0.25)}, {"median", at(0.5)}, {"q3", at(0.75)}, {"max", at(1.0)}};
}

nlohmann::json LoadReport(const std::vector<RoundLoad>& loads, int discarded) {
  int disturbed_kept = 0;
  double share_max = 0.0;
  double load_min = loads.front().loadavg;
  double load_max = loads.front().loadavg;
  for (const RoundLoad& l : loads) {
    disturbed_kept += l.disturbed ? 1 : 0;
    share_max = std::max(share_max, l.others_share);
    load_min = std::min(load_min, l.loadavg);
    load_max = std::max(load_max, l.loadavg);
  }
  return {{"kept", loads.size()},
          {"discarded", discarded},
          {"disturbed_kept", disturbed_kept},
          {"others_share_max", share_max},
          {"loadavg_min", load_min},
          {"loadavg_max", load_max}};
}

std::vector<std::size_t> RoundOrder(std::size_t n, std::size_t r) {
  std::vector<std::size_t> order(n);
  std::size_t lo = 1;
  std::size_t hi = n - 1;
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t base = j == 0 ? 0 : (j % 2 == 1 ? lo++ : hi--);  // 0, 1, n-1, 2, n-2, ...
    order[j] = (base + r) % n;
  }
  if (n % 2 == 1 && (r / n) % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace fusedopt::bench
