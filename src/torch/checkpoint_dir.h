// A Trainer's checkpoint folder, named as fusedopt.Trainer names it: step-NNNNNNNN.safetensors
// (NNNNNNNN: micro-batches trained, at least 8 digits), written by WriteCheckpointFile through
// temporary files .step-NNNNNNNN.safetensors.tmp.<pid>.<n>; or `fusedopt train --dist`'s shard
// sets saved at that name (step-NNNNNNNN.rank<r>-of-<P>.safetensors). No torch here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fusedopt::pt::detail {

// dir/step-NNNNNNNN.safetensors
std::string CheckpointName(const std::string& dir, std::int64_t step);

// Makes the folder, checks that a file can be written there now (std::system_error naming the
// folder otherwise), and removes the temporary files that killed saves left.
void PrepareCheckpointDir(const std::string& dir);

// The checkpoints in dir by step, each named by its path (a file's, or the path a set was saved
// at); none if dir does not exist.
std::map<std::int64_t, std::string> ListCheckpoints(const std::string& dir);

// Removes all but the newest `keep` checkpoints (keep 0: none removed).
void DropOldCheckpoints(const std::string& dir, int keep);

// The newest checkpoint in dir that verifies (ReadCheckpoint), or none; each newer one that
// does not is added to `skipped` as "path: why".
std::optional<std::string> LatestCheckpoint(const std::string& dir,
                                            std::vector<std::string>* skipped = nullptr);

}  // namespace fusedopt::pt::detail
