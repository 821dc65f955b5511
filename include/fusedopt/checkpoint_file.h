// The checkpoint container: one safetensors file (shared/docs/formats.md) with an XXH3-64 checksum
// of the whole file, written durably. What goes inside (optimizer state, model, scaler, ...) is the
// caller's: C++ and Python (python/fusedopt/checkpoint.py, through fusedopt._C) write and read it
// with these two functions.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON header (compact, padded with
// spaces to a multiple of 8, so the data section starts 8-aligned), then the data section, every
// byte of it indexed by exactly one tensor. The header has one entry per tensor,
// {"data_offsets":[begin,end],"dtype":.., "shape":[..]} with offsets relative to the data section
// (tensors end to end in the order given; a tensor's own offset need not be aligned), and
// "__metadata__": {"checksum": "xxh3-64:<16 hex digits>", "format": "fusedopt.checkpoint",
// "fusedopt": <the caller's metadata>, "version": "1"}. The checksum is XXH3-64 of the whole file
// with its own 16 digits read as '0': any changed byte, in the lengths, the header or the data, is
// caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fusedopt {

// One tensor to write: C-contiguous little-endian bytes, exactly numel * itemsize of them.
struct CheckpointTensor {
  std::string name;   // e.g. "state.3.exp_avg"; not empty, unique, not "__metadata__"
  std::string dtype;  // safetensors': "F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL"
  std::vector<std::int64_t> shape;  // {} for a 0-d tensor (1 element); a 0 makes an empty tensor
  std::span<const std::byte> data;
};

// A file that is not a valid checkpoint (truncated, corrupted, not a fusedopt checkpoint, another
// version); what() names the path and what is wrong.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One tensor of a file read.
struct CheckpointEntry {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;  // into CheckpointFile::data
  std::size_t nbytes = 0;  // numel * itemsize
};

struct CheckpointFile {
  std::string metadata;  // the caller's, as written
  std::vector<CheckpointEntry>
      tensors;                  // in the order of their data (empty ones at one offset: by name)
  std::vector<std::byte> data;  // the data section
};

// The largest header ReadCheckpointFile accepts by default (safetensors' own limit is 1e8 bytes).
inline constexpr std::size_t kMaxCheckpointHeaderBytes = std::size_t{100} << 20;

// Writes `tensors` and `metadata` (a JSON text, stored as a string) to `path`, durably: a temporary
// file
// `.<name>.tmp.<pid>.<n>` in the same directory, fsync, rename over `path`, fsync of the directory;
// a crash at any instant leaves either the old file or the new one at `path`, whole. Bad arguments
// (an unknown dtype, a data size other than numel * itemsize, an empty, reserved or repeated name,
// text that is not UTF-8) throw fusedopt::Error (a std::invalid_argument) naming the tensor before
// any file is made. A failed write (ENOSPC, EFBIG, EACCES, EROFS, a missing directory, ...) throws
// std::system_error with the errno, naming the step and `path`, after removing the temporary file:
// `path` is as it was.
void WriteCheckpointFile(const std::string& path, std::string_view metadata,
                         std::span<const CheckpointTensor> tensors);

// Reads `path` and verifies it all (lengths, header, format and version, dtypes, shapes, offsets
// covering the data section exactly once, checksum) without reading out of bounds, whatever its
// bytes: CheckpointError says what is wrong; std::system_error if the file cannot be opened or
// read.
CheckpointFile ReadCheckpointFile(const std::string& path,
                                  std::size_t max_header_bytes = kMaxCheckpointHeaderBytes);

// The bytes a tensor of `dtype` and `shape` takes in a checkpoint; none for a dtype the format does
// not hold, a negative dimension or a size that overflows.
std::optional<std::size_t> CheckpointTensorBytes(std::string_view dtype,
                                                 std::span<const std::int64_t> shape);

// Shard sets: a sharded run's checkpoint as one file per rank (SaveShardedCheckpoint in
// fusedopt/checkpoint.h), each written as above. The checkpoint saved "at" dir/step-100.safetensors
// is the files dir/step-100.rank<r>-of-<P>.safetensors, r = 0..P-1. Each file's metadata has a
// "shard" record {"set": the save's random id, "rank": r, "ranks": P}; rank 0's also lists every
// tensor of the whole checkpoint ("tensors": [[name, dtype, shape], ...], in file order) and holds
// the metadata and the tensors that are not sharded. A sharded tensor lies in pieces
// "<name>@<first element>" (1-D) across the files; together they cover it exactly once.

// The file of rank `rank` of a set of `ranks` saved at `path`.
std::string CheckpointShardPath(const std::string& path, int rank, int ranks);

// The files of the shard set saved at `path`, by rank (found in its directory). Throws
// CheckpointError when there is none, when files of several world sizes lie there, or when a
// rank's file is missing.
std::vector<std::string> FindCheckpointShards(const std::string& path);

// Reads and verifies the files of one shard set (in any order), checks that they are every rank
// of one save, and assembles the checkpoint they hold: the one file a consolidated save of the same
// state writes (its metadata, tensors and data). CheckpointError says what is wrong: a file that
// does not verify or is not a shard, a rank missing or given twice, files of different saves or
// world sizes, pieces that do not cover a tensor exactly once.
CheckpointFile ReadCheckpointShards(std::span<const std::string> paths,
                                    std::size_t max_header_bytes = kMaxCheckpointHeaderBytes);

// The checkpoint at `path`: the file, or where no file is, the shard set saved there.
CheckpointFile ReadCheckpoint(const std::string& path,
                              std::size_t max_header_bytes = kMaxCheckpointHeaderBytes);

// Removes what lies at `path` but the shard set of `ranks` ranks: a file, and the files of other
// world sizes' sets (a sharded save's clean-up, once its set is whole).
void RemoveCheckpointsAt(const std::string& path, int ranks);

// Writes a checkpoint as read (e.g. a shard set assembled) to `path`, as WriteCheckpointFile.
void WriteCheckpointFile(const std::string& path, const CheckpointFile& file);

// The metadata's "layout_hash" (python/fusedopt/checkpoint.py, src/checkpoint/checkpoint.cc):
// XXH3-64 of the layout record's compact JSON text, as 16 hex digits.
std::string LayoutHash(std::string_view layout_json);

}  // namespace fusedopt
