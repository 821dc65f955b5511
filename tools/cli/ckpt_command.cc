// `fusedopt ckpt inspect|verify FILE...`: what a checkpoint file holds (docs/checkpoints.md), and
// whether it is whole. Both read each file with the engine's reader
// (include/fusedopt/checkpoint_file.h), which checks the format, every offset and the checksum;
// neither needs torch.

#include <cstddef>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
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
}

void Inspect(const std::string& path) {
  const CheckpointFile file = ReadCheckpointFile(path);
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
      "ckpt", "Checkpoint files: inspect (metadata and tensors) or verify (format and checksum)");
  struct Options {
    std::string action;
    std::vector<std::string> files;
  };
  auto options = std::make_shared<Options>();
  ckpt->add_option("action", options->action, "inspect or verify")
      ->required()
      ->check(CLI::IsMember({"inspect", "verify"}));
  ckpt->add_option("files", options->files, "Checkpoint files (.safetensors)")->required();
  return {ckpt, [options] {
            // Every file is read, each failure named; the exit status is 1 if any failed.
            int status = 0;
            for (const std::string& path : options->files) {
              const int rc = RunCommand("ckpt", [&] {
                if (options->action == "inspect") {
                  Inspect(path);
                } else {
                  const CheckpointFile file = ReadCheckpointFile(path);
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
