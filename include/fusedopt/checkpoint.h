// Checkpoints of the core Optimizer: everything a run needs to continue bit for bit — params,
// states, f32 masters, step counts, hyper-parameters, the accumulation window and the loss
// scaler's state — in one checkpoint file (fusedopt/checkpoint_file.h: checksummed, written
// durably), with the names and the metadata record that fusedopt.save_checkpoint writes
// (docs/checkpoints.md): state.<i>.<torch's state key>, state.<i>.step, state.<i>.master_param,
// accumulator.<i>, and param.<i> for the params this optimizer owns.
//
//   fusedopt::SaveCheckpoint(opt, "ckpt/step-100.safetensors", &scaler, {{"updates", 100}});
//   ...
//   fusedopt::CheckpointCounters c = fusedopt::LoadCheckpoint(opt, "ckpt/step-100.safetensors",
//                                                            &scaler);
//
// LoadCheckpoint checks everything before it changes anything: a file that does not verify, of
// another algorithm or layout (group sizes, numel and dtype of each tensor), or without a part
// asked for throws CheckpointError saying what differs, and the optimizer and scaler are as they
// were. The hyper-parameters come from the file, as torch's load_state_dict restores its
// param_groups; the storage options (dtypes, master copies, accumulation_steps, stochastic
// rounding) are the optimizer's own: saved states of another float dtype are converted.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "fusedopt/checkpoint_file.h"
#include "fusedopt/distributed.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/scaler.h"

namespace fusedopt {

// A training loop's counters, saved beside the optimizer (Python's `extra`), e.g. {"updates", 100}.
using CheckpointCounters = std::map<std::string, std::int64_t>;

// Writes the optimizer (and the scaler's scale and growth tracker, when given) to `path`. A
// failed write throws std::system_error and leaves the previous file at `path` whole.
template <class Hyper>
void SaveCheckpoint(const Optimizer<Hyper>& optimizer, const std::string& path,
                    const LossScaler* scaler = nullptr, const CheckpointCounters& counters = {});

// Restores a SaveCheckpoint file (or shard set, below) into `optimizer` (and `scaler`, when given:
// the file must hold one); returns the counters it was saved with.
template <class Hyper>
CheckpointCounters LoadCheckpoint(Optimizer<Hyper>& optimizer, const std::string& path,
                                  LossScaler* scaler = nullptr);

// The same for a DistributedOptimizer; collective: every rank calls them. SaveCheckpoint gathers
// every rank's shards and rank 0 writes the whole state: the checkpoint of the one-process
// Optimizer the run equals (its metadata says the world size), which loads into an Optimizer or a
// DistributedOptimizer of any world size and zero level. LoadCheckpoint: every rank reads `path`
// (a file system they share), checks it and keeps what its shards hold; a failure on any rank
// throws on every rank (the others' CheckpointError says another rank failed), and no rank has
// changed anything. A failed write throws on every rank too.
template <class Hyper>
void SaveCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                    const LossScaler* scaler = nullptr, const CheckpointCounters& counters = {});
template <class Hyper>
CheckpointCounters LoadCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                                  LossScaler* scaler = nullptr);

// A sharded save (collective): nothing is gathered; every rank writes its own file of the shard
// set at `path` (fusedopt/checkpoint_file.h: path.rank<r>-of-<P>.safetensors), with the states
// and masters of its shard of every bucket, and rank 0 the metadata, params and scalar states.
// Once every rank's file is written, rank 0 removes what else lay at `path` (a file, another world
// size's set). A failed write throws on every rank, and the files of the set written are removed.
// Every LoadCheckpoint above takes the set's
// `path` (every rank reads the whole set; any world size and zero level), and
// `fusedopt ckpt consolidate` merges it into the one file SaveCheckpoint writes, byte for byte.
// Save each set under a new name (as the Trainers do): a crash while writing a set over an older
// one of the same name can leave files of both, which loading refuses.
template <class Hyper>
void SaveShardedCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                           const LossScaler* scaler = nullptr,
                           const CheckpointCounters& counters = {});

}  // namespace fusedopt
