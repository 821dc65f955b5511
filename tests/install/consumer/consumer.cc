// Uses the installed core as docs/cpp-api.md shows: one AdamW step, checked against the update
// written out in double. On step 1 the bias-corrected moments are g and g^2, so torch's AdamW
// update is p <- p (1 - lr wd) - lr g / (|g| + eps).
#include <cmath>
#include <cstdio>
#include <span>

#include "fusedopt/optimizer.h"

int main() {
  const double lr = 1e-2, wd = 1e-2, eps = 1e-8;
  fusedopt::AdamW opt({fusedopt::AdamWHyper{.lr = lr, .weight_decay = wd}}, {{.numel = 3}});
  std::span<float> p = opt.storage().params<float>(0);
  std::span<float> g = opt.storage().grads<float>(0);
  const double p0[] = {1.0, -2.0, 0.5}, g0[] = {0.3, -0.1, 2.0};
  for (int i = 0; i < 3; ++i) {
    p[i] = static_cast<float>(p0[i]);
    g[i] = static_cast<float>(g0[i]);
  }
  opt.Step();
  for (int i = 0; i < 3; ++i) {
    const double expected = p0[i] * (1 - lr * wd) - lr * g0[i] / (std::abs(g0[i]) + eps);
    if (std::abs(p[i] - expected) > 1e-6 * std::abs(expected) + 1e-7) {
      std::printf("param %d: %.9g, expected %.9g\n", i, p[i], expected);
      return 1;
    }
  }
  std::printf("consumer: fusedopt::AdamW step matches the reference\n");
  return 0;
}
