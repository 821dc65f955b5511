// What the sources of DistributedOptimizer and ShardLayout share: the error prefix and the mixing
// step of the layout hashes every rank compares.
#pragma once

#include <cstdint>

namespace fusedopt::distributed {

inline constexpr const char* kFn = "DistributedOptimizer";

// One FNV-1a round per byte of `value`.
inline void Mix(std::uint64_t& hash, std::uint64_t value) {
  for (int byte = 0; byte < 8; ++byte) {
    hash ^= (value >> (8 * byte)) & 0xff;
    hash *= 0x100000001b3ull;  // FNV-1a's 64-bit prime
  }
}

}  // namespace fusedopt::distributed
