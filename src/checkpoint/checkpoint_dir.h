// A training run's checkpoint folder, the one policy of fusedopt.Trainer
// (python/fusedopt/trainer.py, through _C), the C++ Trainer (src/torch/trainer.cc) and `fusedopt
// train --dist` (tools/train/run_dist.cc): checkpoints are named step-NNNNNNNN.safetensors
// (NNNNNNNN: micro-batches or updates trained, at least 8 digits), written by WriteCheckpointFile
// through temporary files .step-NNNNNNNN.safetensors.tmp.<pid>.<n>; or they are shard sets saved at
// that name (step-NNNNNNNN.rank<r>-of-<P>.safetensors). Standard library and
// fusedopt/checkpoint_file.h only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fusedopt::checkpoint_dir {

// dir/step-NNNNNNNN.safetensors
std::string CheckpointName(const std::string& dir, std::int64_t step);

// Makes the folder, checks that a file can be written there now, and removes the temporary files
// that killed saves left. A folder that cannot be made or written throws std::system_error (its
// errno) whose message is `name` (how the caller names the folder, e.g. "checkpoint_dir '/x'")
// followed by " is not writable".
void PrepareCheckpointDir(const std::string& dir, const std::string& name);

// The checkpoints in dir by step, each named by its path (a file's, or the path a set was saved
// at); none if dir does not exist.
std::map<std::int64_t, std::string> ListCheckpoints(const std::string& dir);

// Removes all but the newest `keep` checkpoints, a file or a whole shard set each (keep 0: none
// removed).
void DropOldCheckpoints(const std::string& dir, int keep);

// The newest checkpoint in dir that verifies (ReadCheckpoint: format, offsets, checksum; a set
// assembled), or none; each newer one that does not is added to `skipped` as "path: why".
std::optional<std::string> LatestCheckpoint(const std::string& dir,
                                            std::vector<std::string>* skipped = nullptr);

}  // namespace fusedopt::checkpoint_dir
