// src/checkpoint/checkpoint_dir.h: the names, the folder check, pruning and the newest checkpoint
// that verifies, for fusedopt.Trainer, the C++ Trainer and `fusedopt train --dist` alike.

#include "src/checkpoint/checkpoint_dir.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <system_error>

#include "fusedopt/checkpoint_file.h"

namespace fusedopt::checkpoint_dir {
namespace {

namespace fs = std::filesystem;

const std::regex& CheckpointPattern() {
  // A file, or a file of a shard set (a distributed run's): the same checkpoint's name.
  static const std::regex kPattern(R"(step-(\d{8,})(\.rank\d+-of-\d+)?\.safetensors)");
  return kPattern;
}

}  // namespace

std::string CheckpointName(const std::string& dir, std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08lld.safetensors", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

void PrepareCheckpointDir(const std::string& dir, const std::string& name) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path probe = fs::path(dir) / (".fusedopt-write-test." + std::to_string(::getpid()));
  if (!ec) {
    std::ofstream out(probe);
    if (!out) ec = std::error_code(errno != 0 ? errno : EACCES, std::generic_category());
  }
  if (ec) {
    throw std::system_error(ec, name + " is not writable");
  }
  fs::remove(probe, ec);
  static const std::regex kStale(R"(\.step-\d{8,}(\.rank\d+-of-\d+)?\.safetensors\.tmp\..*)");
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (std::regex_match(e.path().filename().string(), kStale)) fs::remove(e.path(), ec);
  }
}

std::map<std::int64_t, std::string> ListCheckpoints(const std::string& dir) {
  std::map<std::int64_t, std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, CheckpointPattern())) {
      const std::string digits = m[1].str();
      std::int64_t step = 0;
      const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), step);
      if (parsed.ec == std::errc()) found[step] = CheckpointName(dir, step);  // (none past int64)
    }
  }
  return found;
}

void DropOldCheckpoints(const std::string& dir, int keep) {
  if (keep <= 0) return;
  const auto found = ListCheckpoints(dir);
  auto it = found.begin();
  for (std::size_t n = found.size(); n > static_cast<std::size_t>(keep); --n, ++it) {
    RemoveCheckpointsAt(it->second, 0);  // the file, or every file of the set
  }
}

std::optional<std::string> LatestCheckpoint(const std::string& dir,
                                            std::vector<std::string>* skipped) {
  const auto found = ListCheckpoints(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    try {
      ReadCheckpoint(it->second);  // the file, or the shard set assembled
      return it->second;
    } catch (const std::exception& e) {  // CheckpointError, or a file that cannot be read
      if (skipped != nullptr) skipped->push_back(it->second + ": " + e.what());
    }
  }
  return std::nullopt;
}

}  // namespace fusedopt::checkpoint_dir
