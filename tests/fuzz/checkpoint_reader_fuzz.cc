// A libFuzzer target for the checkpoint reader, fusedopt::ReadCheckpointFile and
// ReadCheckpointShards (include/fusedopt/checkpoint_file.h): whatever the bytes of the file, it
// must not read out of bounds, and it may only throw fusedopt::CheckpointError (a bad file) or
// std::system_error (the file cannot be read). Any other exception, a crash, or an ASan/UBSan
// report is a finding. scripts/fuzz builds it (clang -fsanitize=fuzzer,address,undefined) and runs
// it over the seed corpus in tests/fuzz/corpus/ (tests/fuzz/make_corpus.py made it).
//
// Each input is read three ways:
//  1. as it is, with a small header limit (1 MiB) and with the default one (100 MiB);
//  2. with its checksum set right, when it has one in place. The reader checks the XXH3-64 checksum
//     before it believes anything in the header, so nearly every mutation of a valid file stops
//     there ("checksum mismatch") and mode 1 alone would never reach the code that checks the JSON
//     header, the dtypes, shapes and data_offsets. Mode 2 writes the correct 16 digits into the
//     first `"checksum":"xxh3-64:` of the header (the place the reader takes them from) before
//     reading, so the fuzzer explores that code as well.
//  3. when a read succeeds: the file is written again with WriteCheckpointFile and read back, which
//     must give the same checkpoint. This checks what the reader promises on success (every
//     tensor's bytes inside the data section, numel * itemsize of them, the section covered exactly
//     once), since the writer refuses any tensor whose data size does not match its shape and
//     dtype.
//  4. when a read succeeds: as a shard set of that one file (ReadCheckpointShards), which parses
//     the shard record and assembles the pieces; what it assembles goes through 3.
//
// The input travels as a file, as the reader takes a path: one file (and one for mode 3) in a
// directory of this process under $TMPDIR (or /tmp), reused for every input, removed at a normal
// exit (after a crash, scripts/fuzz removes it: it runs the target with a TMPDIR of its own).

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fusedopt/checkpoint_file.h"

namespace {

// As in src/checkpoint/checkpoint_file.cc: the reader takes the 16 hex digits that follow the first
// occurrence of this key in the header.
constexpr std::string_view kChecksumKey = R"("checksum":"xxh3-64:)";
constexpr std::size_t kDigits = 16;
constexpr std::size_t kSmallHeaderLimit = std::size_t{1} << 20;

// Stops the run with a message: libFuzzer reports the abort as a crash and saves the input.
[[noreturn]] void Finding(const std::string& what) {
  std::fprintf(stderr, "checkpoint_reader_fuzz: FINDING: %s\n", what.c_str());
  std::abort();
}

// The per-process directory and the two files in it.
class TempFiles {
 public:
  TempFiles() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                          "/checkpoint_reader_fuzz.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) Finding("cannot create a directory " + pattern);
    dir_ = pattern;
    input_ = dir_ + "/input.safetensors";
    rewritten_ = dir_ + "/rewritten.safetensors";
  }
  TempFiles(const TempFiles&) = delete;
  TempFiles& operator=(const TempFiles&) = delete;
  ~TempFiles() {
    ::unlink(input_.c_str());
    ::unlink(rewritten_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& input() const { return input_; }
  const std::string& rewritten() const { return rewritten_; }

 private:
  std::string dir_, input_, rewritten_;
};

const TempFiles& Files() {
  static const TempFiles files;
  return files;
}

void WriteFile(const std::string& path, std::span<const std::uint8_t> bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Finding("cannot create " + path);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) Finding("cannot write " + path);
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) Finding("cannot close " + path);
}

// Reads `path`; false when the reader rejected it with one of the exceptions it documents. Every
// other exception leaves this function and LLVMFuzzerTestOneInput: std::terminate prints its type
// and what(), and libFuzzer reports the abort.
bool TryRead(const std::string& path, std::size_t max_header_bytes, fusedopt::CheckpointFile& out) {
  try {
    out = fusedopt::ReadCheckpointFile(path, max_header_bytes);
    return true;
  } catch (const fusedopt::CheckpointError&) {
  } catch (const std::system_error&) {
  }
  return false;
}

// Sets the checksum digits of `bytes` (a whole file) to the value the reader computes: XXH3-64 of
// the whole file with its own 16 digits read as '0'. False when there is no header of the stated
// length with the key and 16 bytes after it inside; the reader then fails before the checksum.
bool FixChecksum(std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < 8) return false;
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < 8; ++i) n |= std::uint64_t{bytes[i]} << (8 * i);
  if (n > bytes.size() - 8) return false;
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  const std::size_t at = header.find(kChecksumKey);
  if (at == std::string_view::npos || at + kChecksumKey.size() + kDigits > header.size()) {
    return false;
  }
  const std::size_t digits = 8 + at + kChecksumKey.size();
  for (std::size_t i = 0; i < kDigits; ++i) bytes[digits + i] = '0';
  const XXH64_hash_t h = XXH3_64bits(bytes.data(), bytes.size());
  static constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < kDigits; ++i) {
    bytes[digits + kDigits - 1 - i] = static_cast<std::uint8_t>(kHex[(h >> (4 * i)) & 0xF]);
  }
  return true;
}

bool SameEntries(const fusedopt::CheckpointFile& a, const fusedopt::CheckpointFile& b) {
  if (a.metadata != b.metadata || a.data != b.data || a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const fusedopt::CheckpointEntry& x = a.tensors[i];
    const fusedopt::CheckpointEntry& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.offset != y.offset ||
        x.nbytes != y.nbytes) {
      return false;
    }
  }
  return true;
}

// Mode 3: a checkpoint the reader accepted, written again and read back.
void CheckRoundTrip(const fusedopt::CheckpointFile& file) {
  std::vector<fusedopt::CheckpointTensor> tensors;
  tensors.reserve(file.tensors.size());
  const std::span<const std::byte> data(file.data);
  for (const fusedopt::CheckpointEntry& e : file.tensors) {
    if (e.offset > data.size() || e.nbytes > data.size() - e.offset) {
      Finding("tensor '" + e.name + "' accepted with bytes [" + std::to_string(e.offset) + ", +" +
              std::to_string(e.nbytes) + ") outside the " + std::to_string(data.size()) +
              "-byte data section");
    }
    tensors.push_back({e.name, e.dtype, e.shape, data.subspan(e.offset, e.nbytes)});
  }
  // Any exception here (fusedopt::Error: a tensor whose size does not match its shape and dtype)
  // is a finding.
  fusedopt::WriteCheckpointFile(Files().rewritten(), file.metadata, tensors);
  const fusedopt::CheckpointFile again = fusedopt::ReadCheckpointFile(Files().rewritten());
  if (!SameEntries(file, again)) Finding("an accepted checkpoint reads back differently");
}

// The input read as a shard set of one file (ReadCheckpointShards: the shard record, rank 0's
// tensor list, the pieces): assembled or refused with CheckpointError; what it assembles is written
// and read back like any accepted file.
void CheckShardSet(const std::string& path) {
  fusedopt::CheckpointFile whole;
  try {
    whole = fusedopt::ReadCheckpointShards(std::vector<std::string>{path});
  } catch (const fusedopt::CheckpointError&) {
    return;
  } catch (const std::system_error&) {
    return;
  }
  CheckRoundTrip(whole);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = Files().input();
  const std::span<const std::uint8_t> input(data, size);
  fusedopt::CheckpointFile file;

  // Mode 1: the bytes as they are.
  WriteFile(path, input);
  const bool small_ok = TryRead(path, kSmallHeaderLimit, file);
  const bool default_ok = TryRead(path, fusedopt::kMaxCheckpointHeaderBytes, file);
  if (small_ok && !default_ok) Finding("accepted under the 1 MiB header limit, not the default");
  if (default_ok) {
    CheckRoundTrip(file);
    CheckShardSet(path);
  }

  // Mode 2: the same bytes with the checksum the reader computes, past which the parser is reached.
  std::vector<std::uint8_t> fixed(input.begin(), input.end());
  if (FixChecksum(fixed) && !std::equal(fixed.begin(), fixed.end(), input.begin())) {
    WriteFile(path, fixed);
    if (TryRead(path, fusedopt::kMaxCheckpointHeaderBytes, file)) {
      CheckRoundTrip(file);
      CheckShardSet(path);
    }
  }
  return 0;
}
