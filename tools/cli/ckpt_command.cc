// `fusedopt ckpt inspect|verify FILE...`: what a checkpoint file holds (docs/checkpoints.md), and
// whether it is whole (FILE may be the path a shard set was saved at: the set assembled); `fusedopt
// ckpt consolidate SHARD... -o FILE`: the files of a shard set merged into the one file a
// consolidated save writes. All read with the engine's reader (include/fusedopt/checkpoint_file.h),
// which checks the format, every offset and the checksum; none needs torch.

#include <cstddef>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/checkpoint_file.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {
namespace {

std::string Shape(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

// The summary lines of the metadata save_checkpoint writes (python/fusedopt/checkpoint.py); another
// writer's metadata is printed as it is.
void PrintMetadata(const std::string& text) {
  const nlohmann::json meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("fusedopt_checkpoint")) {
    std::cout << "  metadata: " << text << "\n";
    return;
  }
  for (const char* key : {"optimizer_class", "algorithm", "world_size", "layout_hash"}) {
    if (meta.contains(key)) std::cout << "  " << key << ": " << meta[key].dump() << "\n";
  }
  for (const char* part : {"model", "scaler", "scheduler"}) {
    std::cout << "  " << part << ": "
              << (meta.value(part, nlohmann::json()).is_null() ? "no" : "yes") << "\n";
  }
  const nlohmann::json window = meta.value("accumulation", nlohmann::json());
  if (window.is_object() && window.value("micro_batches", 0) > 0) {
    std::cout << "  inside an accumulation window: " << window["micro_batches"].dump()
              << " micro-batches\n";
  }
  if (meta.contains("extra")) std::cout << "  extra: " << meta["extra"].dump() << "\n";
  const nlohmann::json shard = meta.value("shard", nlohmann::json());
  if (shard.is_object()) {
    std::cout << "  shard: rank " << shard.value("rank", nlohmann::json()).dump() << " of "
              << shard.value("ranks", nlohmann::json()).dump() << " (save "
              << shard.value("set", nlohmann::json()).dump() << ")\n";
  }
}

void Inspect(const std::string& path) {
  const CheckpointFile file = ReadCheckpoint(path);
  std::cout << path << ": " << file.tensors.size() << " tensors, " << file.data.size()
            << " bytes of data, checksum ok\n";
  PrintMetadata(file.metadata);
  std::size_t width = 4;
  for (const CheckpointEntry& e : file.tensors) width = std::max(width, e.name.size());
  for (const CheckpointEntry& e : file.tensors) {
    std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << e.name << "  "
              << std::setw(4) << e.dtype << "  " << std::setw(14) << Shape(e.shape) << std::right
              << std::setw(12) << e.nbytes << " bytes\n";
  }
}

}  // namespace

Command AddCkptCommand(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt",
      "Checkpoint files: inspect (metadata and tensors), verify (format and checksum), or "
      "consolidate a shard set into one file");
  struct Options {
    std::string action;
    std::vector<std::string> files;
    std::string output;
  };
  auto options = std::make_shared<Options>();
  ckpt->add_option("action", options->action, "inspect, verify or consolidate")
      ->required()
      ->check(CLI::IsMember({"inspect", "verify", "consolidate"}));
  ckpt->add_option("files", options->files,
                   "Checkpoint files (.safetensors), or the paths shard sets were saved at; "
                   "consolidate: one set's path, or every rank's file of it")
      ->required();
  ckpt->add_option("-o,--output", options->output, "consolidate: the file to write");
  return {ckpt, [options] {
            if (options->action == "consolidate") {
              return RunCommand("ckpt", [&] {
                if (options->output.empty()) {
                  throw std::invalid_argument("ckpt consolidate: --output FILE is required");
                }
                // One path that is no file: the path the set was saved at.
                const bool saved_at =
                    options->files.size() == 1 && !std::filesystem::exists(options->files[0]);
                const std::vector<std::string> files =
                    saved_at ? FindCheckpointShards(options->files[0]) : options->files;
                const CheckpointFile whole = ReadCheckpointShards(files);
                WriteCheckpointFile(options->output, whole);
                std::cout << "wrote " << options->output << ": " << files.size() << " shards, "
                          << whole.tensors.size() << " tensors, " << whole.data.size()
                          << " bytes of data\n";
              });
            }
            // Every file is read, each failure named; the exit status is 1 if any failed.
            int status = 0;
            for (const std::string& path : options->files) {
              const int rc = RunCommand("ckpt", [&] {
                if (options->action == "inspect") {
                  Inspect(path);
                } else {
                  const CheckpointFile file = ReadCheckpoint(path);
                  std::cout << "ok " << path << ": " << file.tensors.size() << " tensors, "
                            << file.data.size() << " bytes of data\n";
                }
              });
              status = std::max(status, rc == 0 ? 0 : 1);
            }
            return status;
          }};
}

}  // namespace fusedopt::cli
