// The checkpoint container (include/fusedopt/checkpoint_file.h): safetensors with an XXH3-64
// checksum of the whole file, durable writes (temporary file, fsync, rename, fsync of the
// directory), and a reader that checks every length and offset before it trusts it, so no input
// makes it read out of bounds.

#include "fusedopt/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedopt/error.h"

namespace fusedopt {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kFormat = "fusedopt.checkpoint";
constexpr std::string_view kVersion = "1";
constexpr std::string_view kMetadataKey = "__metadata__";
// The raw header bytes hold this exactly once (compact JSON; inside a JSON string every '"' is
// escaped, so neither a name nor the metadata can repeat it), followed by the 16 digits and a '"'.
constexpr std::string_view kChecksumKey = R"("checksum":"xxh3-64:)";
constexpr std::size_t kDigits = 16;
constexpr char kZeros[kDigits + 1] = "0000000000000000";

// Bytes per element of a dtype this format holds (formats.md: the classic safetensors subset); 0
// for any other.
std::size_t ItemSize(std::string_view dtype) {
  static constexpr std::array<std::pair<std::string_view, std::size_t>, 8> kSizes{{{"F32", 4},
                                                                                   {"F16", 2},
                                                                                   {"BF16", 2},
                                                                                   {"F64", 8},
                                                                                   {"I64", 8},
                                                                                   {"I32", 4},
                                                                                   {"U8", 1},
                                                                                   {"BOOL", 1}}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

// numel * item of `shape` into `bytes`; false when a dimension is negative or the product overflows
// size_t. A 0 anywhere makes 0 bytes, whatever the other dimensions.
bool ByteSize(std::span<const std::int64_t> shape, std::size_t item, std::size_t& bytes) {
  bytes = item;
  if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; })) return false;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    bytes = 0;
    return true;
  }
  for (const std::int64_t d : shape) {
    const auto n = static_cast<std::uint64_t>(d);
    if (n > std::numeric_limits<std::size_t>::max() / bytes) return false;
    bytes *= n;
  }
  return true;
}

std::string Hex(std::uint64_t h) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(kDigits, '0');
  for (std::size_t i = 0; i < kDigits; ++i) out[kDigits - 1 - i] = kHex[(h >> (4 * i)) & 0xF];
  return out;
}

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::array<unsigned char, 8> LittleEndian(std::uint64_t n) {
  std::array<unsigned char, 8> out{};
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(n >> (8 * i));
  return out;
}

// XXH3-64 of the file's bytes: the 8 length bytes, the header with its 16 checksum digits (at
// `digits`) read as '0', then the data pieces. The same as XXH3_64bits over the file with the
// digits zeroed.
std::uint64_t Checksum(const std::array<unsigned char, 8>& length, std::string_view header,
                       std::size_t digits, std::span<const std::span<const std::byte>> data) {
  const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                              &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  XXH3_64bits_update(state.get(), length.data(), length.size());
  XXH3_64bits_update(state.get(), header.data(), digits);
  XXH3_64bits_update(state.get(), kZeros, kDigits);
  XXH3_64bits_update(state.get(), header.data() + digits + kDigits,
                     header.size() - digits - kDigits);
  for (const std::span<const std::byte> piece : data) {
    XXH3_64bits_update(state.get(), piece.data(), piece.size());
  }
  return XXH3_64bits_digest(state.get());
}

// How often the checksum key occurs in `header`; `digits` is where the digits after the first one
// start.
std::size_t FindChecksum(std::string_view header, std::size_t& digits) {
  std::size_t count = 0;
  digits = std::string_view::npos;
  for (std::size_t at = header.find(kChecksumKey); at != std::string_view::npos;
       at = header.find(kChecksumKey, at + 1)) {
    if (count++ == 0) digits = at + kChecksumKey.size();
  }
  return count;
}

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and says whether that worked (NFS and others report a delayed write error here). On
  // Linux the descriptor is gone even after EINTR, and the data were already fsync'ed.
  bool Close() {
    const int fd = std::exchange(fd_, -1);
    return ::close(fd) == 0 || errno == EINTR;
  }

 private:
  int fd_;
};

// Writes all of `data`, looping over partial writes and EINTR; false with errno set on failure.
bool WriteAll(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// Reads all of `size` bytes; false with errno set on failure (EIO: the file shrank while being
// read).
bool ReadAll(int fd, void* data, std::size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

[[noreturn]] void ThrowErrno(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), what);
}

// The header text for `tensors` and `metadata`: compact JSON, checksum digits '0', padded with
// spaces to a multiple of 8 bytes. Throws fusedopt::Error for bad arguments.
std::string MakeHeader(std::string_view metadata, std::span<const CheckpointTensor> tensors) {
  Json header = Json::object();
  std::set<std::string_view> names;
  std::size_t offset = 0;
  for (const CheckpointTensor& t : tensors) {
    const std::string what = "WriteCheckpointFile: tensor '" + t.name + "'";
    if (t.name.empty()) throw Error("WriteCheckpointFile: a tensor with an empty name");
    if (t.name == kMetadataKey) throw Error(what + ": the name is reserved for the metadata");
    if (!names.insert(t.name).second) throw Error(what + ": the name occurs twice");
    const std::size_t item = ItemSize(t.dtype);
    if (item == 0) {
      throw Error(what + ": dtype '" + t.dtype +
                  "' (a checkpoint holds F32 F16 BF16 F64 I64 I32 U8 BOOL)");
    }
    std::size_t bytes = 0;
    if (!ByteSize(t.shape, item, bytes)) throw Error(what + ": a negative or overflowing shape");
    if (bytes != t.data.size()) {
      throw Error(what + ": " + std::to_string(t.data.size()) +
                  " bytes of data, its shape and dtype take " + std::to_string(bytes));
    }
    if (offset > std::numeric_limits<std::size_t>::max() - bytes)
      throw Error(what + ": data too large");
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header[kMetadataKey] = {{"format", kFormat},
                          {"version", kVersion},
                          {"fusedopt", std::string(metadata)},
                          {"checksum", "xxh3-64:" + std::string(kZeros)}};
  std::string text;
  try {
    text = header.dump();               // compact: no spaces
  } catch (const Json::exception& e) {  // a name or the metadata that is not UTF-8
    throw Error(std::string("WriteCheckpointFile: a tensor name or the metadata is not UTF-8 (") +
                e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxCheckpointHeaderBytes) {
    throw Error("WriteCheckpointFile: a header of " + std::to_string(text.size()) +
                " bytes is over the limit of " + std::to_string(kMaxCheckpointHeaderBytes));
  }
  return text;
}

// The directory of `path` and the temporary file's name in it.
std::pair<std::string, std::string> TempPath(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  base.resize(std::min<std::size_t>(base.size(), 200));  // the name stays under NAME_MAX (255)
  const std::string prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  return {dir, prefix + "." + base + ".tmp." + std::to_string(::getpid()) + "." +
                   std::to_string(counter.fetch_add(1))};
}

// A parser callback that records the first key repeated within one object (nlohmann keeps the last
// silently; safetensors forbids duplicate names).
class DuplicateKeys {
 public:
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_.empty()) open_.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_.empty() && !open_.back().insert(parsed.get<std::string>()).second &&
            first_.empty()) {
          first_ = parsed.get<std::string>();
          top_level_ = open_.size() == 1;
        }
        break;
      default:
        break;
    }
    return true;
  }
  const std::string& first() const { return first_; }
  bool top_level() const { return top_level_; }

 private:
  std::vector<std::set<std::string>> open_;
  std::string first_;
  bool top_level_ = false;
};

// The string value `key` of the JSON object `meta`; null when `meta` is null or lacks that string.
const std::string* StringAt(const Json* meta, const char* key) {
  if (meta == nullptr) return nullptr;
  const auto it = meta->find(key);
  return it != meta->end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  [[noreturn]] void Fail(const std::string& what) const {
    throw CheckpointError("checkpoint " + path_ + ": " + what);
  }

  // The metadata value `key`, which must be a string.
  std::string MetaString(const Json& meta, const char* key) const {
    const auto it = meta.find(key);
    if (it == meta.end()) Fail(std::string("no \"") + key + "\" in __metadata__");
    if (!it->is_string()) Fail(std::string("__metadata__ \"") + key + "\" is not a string");
    return it->get<std::string>();
  }

  CheckpointEntry Tensor(const std::string& name, const Json& entry, std::size_t data_size) const {
    const std::string what = "tensor '" + name + "': ";
    if (name.empty()) Fail("a tensor with an empty name");  // the writer's rule
    if (!entry.is_object()) Fail(what + "not a JSON object");
    for (const auto& [key, value] : entry.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        Fail(what + "unknown field '" + key + "'");
    }
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) Fail(what + "no dtype string");
    if (shape == entry.end() || !shape->is_array()) Fail(what + "no shape list");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      Fail(what + "no data_offsets [begin, end] of two non-negative integers");
    }
    CheckpointEntry e;
    e.name = name;
    e.dtype = dtype->get<std::string>();
    const std::size_t item = ItemSize(e.dtype);
    if (item == 0) Fail(what + "unknown dtype '" + e.dtype + "'");
    for (const Json& d : *shape) {
      if (d.is_number_integer() && !d.is_number_unsigned()) {
        Fail(what + "a negative dimension in its shape " + shape->dump());
      }
      if (!d.is_number_unsigned() ||
          d.get<std::uint64_t>() >
              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        Fail(what + "its shape " + shape->dump() +
             " is not a list of non-negative 64-bit integers");
      }
      e.shape.push_back(d.get<std::int64_t>());
    }
    std::size_t bytes = 0;
    if (!ByteSize(e.shape, item, bytes)) Fail(what + "its shape " + shape->dump() + " overflows");
    const auto begin = (*offsets)[0].get<std::uint64_t>();
    const auto end = (*offsets)[1].get<std::uint64_t>();
    const std::string range =
        "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end) Fail(what + range + ": begin after end");
    if (end > data_size) {
      Fail(what + range + " end past the " + std::to_string(data_size) + "-byte data section");
    }
    if (end - begin != bytes) {
      Fail(what + range + " hold " + std::to_string(end - begin) +
           " bytes, its dtype and shape take " + std::to_string(bytes));
    }
    e.offset = begin;
    e.nbytes = bytes;
    return e;
  }

  CheckpointFile Read(std::size_t max_header_bytes) const {
    Fd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) ThrowErrno(errno, "ReadCheckpointFile: cannot open " + path_);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) ThrowErrno(errno, "ReadCheckpointFile: cannot stat " + path_);
    if (!S_ISREG(st.st_mode)) Fail("not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);

    std::array<unsigned char, 8> length{};
    if (size < length.size()) {
      Fail("empty or truncated: " + std::to_string(size) +
           " bytes, fewer than the 8-byte header length a safetensors file starts with");
    }
    if (!ReadAll(fd.get(), length.data(), length.size())) {
      ThrowErrno(errno, "ReadCheckpointFile: cannot read " + path_);
    }
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < 8; ++i) n |= std::uint64_t{length[i]} << (8 * i);
    if (n == 0) Fail("a header of 0 bytes (not a safetensors file, or a corrupted one)");
    if (n > max_header_bytes) {
      Fail("a header of " + std::to_string(n) + " bytes is over the limit of " +
           std::to_string(max_header_bytes) + " (not a safetensors file, or a corrupted one)");
    }
    if (n > size - 8) {
      Fail("truncated: a header of " + std::to_string(n) + " bytes, but the file has only " +
           std::to_string(size - 8) + " bytes after its 8-byte length");
    }
    std::string header(n, '\0');
    CheckpointFile out;
    out.data.resize(size - 8 - n);
    if (!ReadAll(fd.get(), header.data(), header.size()) ||
        !ReadAll(fd.get(), out.data.data(), out.data.size())) {
      ThrowErrno(errno, "ReadCheckpointFile: cannot read " + path_);
    }

    DuplicateKeys duplicates;
    const Json json = Json::parse(header, std::ref(duplicates), /*allow_exceptions=*/false);
    const Json* meta = nullptr;
    if (json.is_object()) {
      const auto it = json.find(kMetadataKey);
      if (it != json.end() && it->is_object()) meta = &*it;
    }
    // A newer version first: it may checksum differently, and cannot be read in any case.
    const std::string* format = StringAt(meta, "format");
    const std::string* version = StringAt(meta, "version");
    const bool ours = format != nullptr && *format == kFormat;
    if (ours && version != nullptr && *version != kVersion) {
      Fail("format version " + *version + "; this fusedopt reads version " + std::string(kVersion));
    }

    // The checksum, before anything else is believed: damage anywhere says "corrupted".
    std::size_t digits = 0;
    const std::size_t count = FindChecksum(header, digits);
    if (count == 0) {
      if (!ours) {
        Fail("not a fusedopt checkpoint: its header has no __metadata__ with format \"" +
             std::string(kFormat) + "\" and checksum");
      }
      Fail("no checksum in its header (expected " + std::string(kChecksumKey) +
           "<16 hex digits>\")");
    }
    if (count > 1) Fail("the checksum occurs " + std::to_string(count) + " times in its header");
    if (digits + kDigits >= header.size() || header[digits + kDigits] != '"' ||
        !IsLowerHex(std::string_view(header).substr(digits, kDigits))) {
      Fail("a malformed checksum (expected xxh3-64: and 16 lowercase hex digits)");
    }
    const std::string stored = header.substr(digits, kDigits);
    const std::span<const std::byte> all(out.data);
    const std::string computed = Hex(Checksum(length, header, digits, std::span(&all, 1)));
    if (stored != computed) {
      Fail("checksum mismatch: the file is corrupted (stored " + stored + ", computed " + computed +
           ")");
    }

    // The checksum holds: what follows finds files made wrongly, not damaged ones.
    if (json.is_discarded()) Fail("its header is not valid JSON (or not UTF-8)");
    if (!json.is_object()) Fail("its header is not a JSON object");
    if (!duplicates.first().empty()) {
      Fail(duplicates.top_level() ? "tensor name '" + duplicates.first() + "' occurs twice"
                                  : "key '" + duplicates.first() + "' occurs twice in one object");
    }
    if (meta == nullptr) Fail("no __metadata__ object in its header");
    for (const auto& [key, value] : meta->items()) {
      if (!value.is_string()) Fail("__metadata__ \"" + key + "\" is not a string");
    }
    if (MetaString(*meta, "format") != kFormat) {
      Fail("not a fusedopt checkpoint (format \"" + *format + "\", expected \"" +
           std::string(kFormat) + "\")");
    }
    MetaString(*meta, "version");  // present: its value was checked above
    if (MetaString(*meta, "checksum") != "xxh3-64:" + stored)
      Fail("__metadata__ \"checksum\" misplaced");
    out.metadata = MetaString(*meta, "fusedopt");

    for (const auto& [name, entry] : json.items()) {
      if (name != kMetadataKey) out.tensors.push_back(Tensor(name, entry, out.data.size()));
    }
    // The data section is indexed entirely, once: no holes, no overlaps (safetensors' rule).
    std::sort(out.tensors.begin(), out.tensors.end(),
              [](const CheckpointEntry& a, const CheckpointEntry& b) {
                return std::tie(a.offset, a.nbytes, a.name) < std::tie(b.offset, b.nbytes, b.name);
              });
    std::size_t next = 0;
    for (const CheckpointEntry& e : out.tensors) {
      if (e.offset != next) {
        Fail("tensor '" + e.name + "' starts at byte " + std::to_string(e.offset) +
             " of the data section, not " + std::to_string(next) +
             (e.offset < next ? ": tensors overlap" : ": a hole between tensors"));
      }
      next = e.offset + e.nbytes;
    }
    if (next != out.data.size()) {
      Fail("the tensors end at byte " + std::to_string(next) + " of a " +
           std::to_string(out.data.size()) + "-byte data section: bytes no tensor holds");
    }
    return out;
  }

 private:
  std::string path_;
};

}  // namespace

void WriteCheckpointFile(const std::string& path, std::string_view metadata,
                         std::span<const CheckpointTensor> tensors) {
  if (path.empty()) throw Error("WriteCheckpointFile: an empty path");
  std::string header = MakeHeader(metadata, tensors);
  std::size_t digits = 0;
  if (FindChecksum(header, digits) != 1) {  // cannot happen: see kChecksumKey
    throw Error("WriteCheckpointFile: the checksum key occurs more than once in the header");
  }
  const std::array<unsigned char, 8> length = LittleEndian(header.size());
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(tensors.size());
  for (const CheckpointTensor& t : tensors) pieces.push_back(t.data);
  header.replace(digits, kDigits, Hex(Checksum(length, header, digits, pieces)));

  // In the same directory: a rename is atomic only within one file system. O_EXCL: never another
  // writer's file (the pid and a counter make the name unique among live writers).
  const auto [dir, tmp_path] = TempPath(path);
  const std::string& tmp =
      tmp_path;  // a plain name: clang 14 (the fuzzer's) lets lambdas take no binding
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.get() < 0)
    ThrowErrno(errno, "WriteCheckpointFile: cannot create a temporary file beside " + path);
  const auto fail = [&](const char* what) {
    const int error = errno;
    ::unlink(tmp.c_str());
    ThrowErrno(error, std::string("WriteCheckpointFile: ") + what + " " + path);
  };
  if (!WriteAll(fd.get(), length.data(), length.size()) ||
      !WriteAll(fd.get(), header.data(), header.size())) {
    fail("cannot write");
  }
  for (const std::span<const std::byte> piece : pieces) {
    if (!WriteAll(fd.get(), piece.data(), piece.size())) fail("cannot write");
  }
  if (::fsync(fd.get()) != 0) fail("cannot fsync");
  if (!fd.Close()) fail("cannot close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename the temporary file to");
  // The rename is durable once the directory is. Some file systems cannot fsync a directory
  // (EINVAL).
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || (::fsync(dir_fd.get()) != 0 && errno != EINVAL)) {
    ThrowErrno(errno, "WriteCheckpointFile: cannot fsync the directory of " + path);
  }
}

CheckpointFile ReadCheckpointFile(const std::string& path, std::size_t max_header_bytes) {
  return Reader(path).Read(max_header_bytes);
}

std::optional<std::size_t> CheckpointTensorBytes(std::string_view dtype,
                                                 std::span<const std::int64_t> shape) {
  const std::size_t item = ItemSize(dtype);
  std::size_t bytes = 0;
  if (item == 0 || !ByteSize(shape, item, bytes)) return std::nullopt;
  return bytes;
}

std::string LayoutHash(std::string_view layout_json) {
  return Hex(XXH3_64bits(layout_json.data(), layout_json.size()));
}

}  // namespace fusedopt
