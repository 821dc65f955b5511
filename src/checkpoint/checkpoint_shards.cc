// Shard sets (include/fusedopt/checkpoint_file.h): finding a set's files, and assembling the one
// checkpoint they hold. The assembly knows nothing of optimizers: rank 0's record lists the
// tensors, and each sharded tensor is put together from its pieces, checked to cover it once.

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint_file.h"

namespace fusedopt {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kExtension = ".safetensors";

// path = <stem><extension>, the extension ".safetensors" or none.
std::pair<std::string, std::string> SplitExtension(const std::string& path) {
  if (path.size() > kExtension.size() && path.ends_with(kExtension)) {
    return {path.substr(0, path.size() - kExtension.size()), std::string(kExtension)};
  }
  return {path, ""};
}

// The rank and world size a shard file's name gives, after "<stem>.rank": "<r>-of-<P><extension>".
bool ParseShardName(std::string_view rest, std::string_view extension, int& rank, int& ranks) {
  if (!rest.ends_with(extension)) return false;
  rest.remove_suffix(extension.size());
  const char* end = rest.data() + rest.size();
  auto [p, ec] = std::from_chars(rest.data(), end, rank);
  if (ec != std::errc() ||
      std::string_view(p, static_cast<std::size_t>(end - p)).substr(0, 4) != "-of-") {
    return false;
  }
  auto [q, ec2] = std::from_chars(p + 4, end, ranks);
  return ec2 == std::errc() && q == end && rank >= 0 && rank < ranks;
}

// The shard files that lie at `path`: world size -> ranks present.
std::map<int, std::set<int>> ShardFilesAt(const std::string& path) {
  const auto [stem, extension] = SplitExtension(path);
  const fs::path base(stem);
  const std::string prefix = base.filename().string() + ".rank";
  std::map<int, std::set<int>> sets;
  std::error_code ec;
  for (const fs::directory_entry& e :
       fs::directory_iterator(base.has_parent_path() ? base.parent_path() : fs::path("."), ec)) {
    const std::string name = e.path().filename().string();
    int rank = 0, ranks = 0;
    if (name.starts_with(prefix) &&
        ParseShardName(std::string_view(name).substr(prefix.size()), extension, rank, ranks)) {
      sets[ranks].insert(rank);
    }
  }
  return sets;
}

[[noreturn]] void Fail(const std::string& what) { throw CheckpointError("shard set: " + what); }

struct Shard {
  std::string path;
  CheckpointFile file;
  Json record;  // the metadata's "shard"
  Json meta;
};

Shard ReadShard(const std::string& path, std::size_t max_header_bytes) {
  Shard s{path, ReadCheckpointFile(path, max_header_bytes), {}, {}};
  s.meta = Json::parse(s.file.metadata, nullptr, /*allow_exceptions=*/false);
  const Json record = s.meta.is_object() ? s.meta.value("shard", Json()) : Json();
  if (!record.is_object() || !record.value("set", Json()).is_string() ||
      !record.value("rank", Json()).is_number_integer() ||
      !record.value("ranks", Json()).is_number_integer()) {
    throw CheckpointError("checkpoint " + path + ": not a file of a shard set (no shard record)");
  }
  s.record = record;
  return s;
}

// The pieces of one sharded tensor, gathered from every file: (first element, file, entry).
struct Piece {
  std::size_t first = 0;
  const Shard* shard = nullptr;
  const CheckpointEntry* entry = nullptr;
};

}  // namespace

std::string CheckpointShardPath(const std::string& path, int rank, int ranks) {
  const auto [stem, extension] = SplitExtension(path);
  return stem + ".rank" + std::to_string(rank) + "-of-" + std::to_string(ranks) + extension;
}

std::vector<std::string> FindCheckpointShards(const std::string& path) {
  const std::map<int, std::set<int>> sets = ShardFilesAt(path);
  if (sets.empty()) {
    throw CheckpointError("checkpoint " + path + ": no such file, nor the files of a shard set (" +
                          CheckpointShardPath(path, 0, 2) + ", ...)");
  }
  if (sets.size() > 1) {
    Fail("files of " + std::to_string(sets.begin()->first) + " and of " +
         std::to_string(sets.rbegin()->first) + " ranks lie at " + path);
  }
  const auto& [ranks, present] = *sets.begin();
  std::vector<std::string> paths;
  for (int r = 0; r < ranks; ++r) {
    if (!present.contains(r)) {
      Fail("rank " + std::to_string(r) + " of " + std::to_string(ranks) + " is missing: no " +
           CheckpointShardPath(path, r, ranks));
    }
    paths.push_back(CheckpointShardPath(path, r, ranks));
  }
  return paths;
}

CheckpointFile ReadCheckpointShards(std::span<const std::string> paths,
                                    std::size_t max_header_bytes) {
  if (paths.empty()) Fail("no files given");
  std::vector<Shard> shards;
  for (const std::string& p : paths) shards.push_back(ReadShard(p, max_header_bytes));
  // One save, every rank once.
  const Json& record0 = shards[0].record;
  const auto ranks = record0["ranks"].get<std::int64_t>();
  std::map<std::int64_t, const Shard*> by_rank;
  for (const Shard& s : shards) {
    const auto rank = s.record["rank"].get<std::int64_t>();
    if (s.record["ranks"] != ranks) {
      Fail(s.path + " is a file of " + s.record["ranks"].dump() + " ranks, " + shards[0].path +
           " of " + std::to_string(ranks));
    }
    if (s.record["set"] != record0["set"]) {
      Fail(s.path + " and " + shards[0].path + " are files of different saves (set " +
           s.record["set"].dump() + " and " + record0["set"].dump() + ")");
    }
    if (rank < 0 || rank >= ranks) {
      Fail(s.path + " says it is rank " + std::to_string(rank) + " of " + std::to_string(ranks));
    }
    if (const auto [at, added] = by_rank.emplace(rank, &s); !added) {
      Fail("rank " + std::to_string(rank) + " is given twice: " + at->second->path + ", " + s.path);
    }
  }
  if (static_cast<std::int64_t>(by_rank.size()) != ranks) {
    std::int64_t missing = 0;
    while (by_rank.contains(missing)) ++missing;
    Fail("rank " + std::to_string(missing) + " of " + std::to_string(ranks) + " is missing (" +
         std::to_string(shards.size()) + " files given)");
  }
  const Shard& root = *by_rank.at(0);

  // The tensors of the whole checkpoint, as rank 0's record lists them.
  CheckpointFile out;
  const Json listed = root.record.value("tensors", Json());
  if (!listed.is_array()) Fail(root.path + ": rank 0's record lists no tensors");
  std::map<std::string, std::size_t> numel;
  for (const Json& t : listed) {
    const auto integer = [](const Json& d) { return d.is_number_integer(); };
    std::optional<std::size_t> bytes;
    if (t.is_array() && t.size() == 3 && t[0].is_string() && t[1].is_string() && t[2].is_array() &&
        std::all_of(t[2].begin(), t[2].end(), integer)) {
      bytes = CheckpointTensorBytes(t[1].get<std::string>(), t[2].get<std::vector<std::int64_t>>());
    }
    if (!bytes.has_value() || numel.contains(t[0].get<std::string>())) {
      Fail(root.path + ": rank 0's tensor list holds " + t.dump());
    }
    out.tensors.push_back({t[0].get<std::string>(), t[1].get<std::string>(),
                           t[2].get<std::vector<std::int64_t>>(), 0, *bytes});
    std::size_t n = 1;  // no overflow: the bytes did not
    for (std::int64_t d : out.tensors.back().shape) n *= static_cast<std::size_t>(d);
    numel[out.tensors.back().name] = n;
  }

  // Rank 0's whole tensors (those its list names), and every other tensor of every file: a piece.
  std::map<std::string, const CheckpointEntry*> whole;
  std::map<std::string, std::vector<Piece>> pieces;
  for (const Shard& s : shards) {
    for (const CheckpointEntry& e : s.file.tensors) {
      if (numel.contains(e.name)) {
        if (&s != &root) Fail(s.path + ": holds '" + e.name + "' whole, as only rank 0's file may");
        whole[e.name] = &e;
        continue;
      }
      const std::size_t at = e.name.rfind('@');
      std::size_t first = 0;
      const char* end = e.name.data() + e.name.size();
      if (at == std::string::npos || e.shape.size() != 1 || e.shape[0] <= 0 ||
          std::from_chars(e.name.data() + at + 1, end, first).ptr != end) {
        Fail(s.path + ": tensor '" + e.name + "' is not a piece <name>@<first element>");
      }
      pieces[e.name.substr(0, at)].push_back({first, &s, &e});
    }
  }

  // Each tensor: rank 0's, or its pieces end to end, covering it exactly once.
  auto append = [&](const Shard& s, const CheckpointEntry& e) {
    const auto from = s.file.data.begin() + static_cast<std::ptrdiff_t>(e.offset);
    out.data.insert(out.data.end(), from, from + static_cast<std::ptrdiff_t>(e.nbytes));
  };
  for (CheckpointEntry& entry : out.tensors) {
    entry.offset = out.data.size();
    const std::size_t n = numel[entry.name];
    if (const auto found = whole.find(entry.name); found != whole.end()) {
      if (found->second->dtype != entry.dtype || found->second->shape != entry.shape) {
        Fail(root.path + ": tensor '" + entry.name + "' is not as rank 0's list says");
      }
      append(root, *found->second);
    } else {
      std::vector<Piece>& list = pieces[entry.name];
      std::sort(list.begin(), list.end(),
                [](const Piece& a, const Piece& b) { return a.first < b.first; });
      std::size_t covered = 0;
      for (const Piece& piece : list) {
        const auto count = static_cast<std::size_t>(piece.entry->shape[0]);
        if (piece.entry->dtype != entry.dtype || piece.first != covered || count > n - covered) {
          Fail(piece.shard->path + ": piece '" + piece.entry->name + "' (" + piece.entry->dtype +
               ", " + std::to_string(count) + " elements) does not continue tensor '" + entry.name +
               "' (" + entry.dtype + ", " + std::to_string(n) + " elements) at element " +
               std::to_string(covered));
        }
        append(*piece.shard, *piece.entry);
        covered += count;
      }
      if (covered != n) {
        Fail("tensor '" + entry.name + "': elements " + std::to_string(covered) + " to " +
             std::to_string(n) + " are in no file");
      }
      pieces.erase(entry.name);
    }
    // Pieces of the listed dtype that cover the listed elements: the listed bytes.
    if (out.data.size() - entry.offset != entry.nbytes) {
      Fail("tensor '" + entry.name + "' assembled from " +
           std::to_string(out.data.size() - entry.offset) + " bytes, not " +
           std::to_string(entry.nbytes));
    }
  }
  if (!pieces.empty()) {
    Fail("pieces of '" + pieces.begin()->first + "', a tensor rank 0's list does not name");
  }
  Json meta = root.meta;
  meta.erase("shard");
  out.metadata = meta.dump();
  return out;
}

CheckpointFile ReadCheckpoint(const std::string& path, std::size_t max_header_bytes) {
  std::error_code ec;
  if (fs::exists(path, ec) || ShardFilesAt(path).empty()) {
    return ReadCheckpointFile(path, max_header_bytes);
  }
  return ReadCheckpointShards(FindCheckpointShards(path), max_header_bytes);
}

void RemoveCheckpointsAt(const std::string& path, int ranks) {
  std::error_code ec;
  fs::remove(path, ec);
  for (const auto& [other, present] : ShardFilesAt(path)) {
    if (other == ranks) continue;
    for (int rank : present) fs::remove(CheckpointShardPath(path, rank, other), ec);
  }
}

void WriteCheckpointFile(const std::string& path, const CheckpointFile& file) {
  std::vector<CheckpointTensor> tensors;
  for (const CheckpointEntry& e : file.tensors) {
    tensors.push_back({e.name, e.dtype, e.shape,
                       std::span<const std::byte>(file.data).subspan(e.offset, e.nbytes)});
  }
  WriteCheckpointFile(path, file.metadata, tensors);
}

}  // namespace fusedopt
