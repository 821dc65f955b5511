// The checkpoint file (include/fusedopt/checkpoint_file.h): round trips of every dtype and of 0-d
// and empty tensors; the layout against the safetensors rules and an XXH3 computed here; every
// class of damage or malformation the reader must reject, each by the check meant for it (headers
// rewritten here get their checksum recomputed, so the checksum does not fire first); bad writer
// arguments; and failed writes (a missing directory, EFBIG from RLIMIT_FSIZE, a directory in the
// way) that leave the old file whole and no temporary file behind.

#include "fusedopt/checkpoint_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "fusedopt/error.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;
using Json = nlohmann::json;

constexpr std::string_view kKey = R"("checksum":"xxh3-64:)";

template <typename T>
Bytes AsBytes(const std::vector<T>& v) {
  Bytes out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

Bytes Iota(std::size_t n, unsigned char start) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>(start + i * 7);
  return out;
}

Bytes Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

void Spill(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::uint64_t HeaderLength(const Bytes& file) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= std::uint64_t{std::to_integer<unsigned char>(file[i])} << (8 * i);
  return n;
}

std::string HeaderText(const Bytes& file) {
  const std::uint64_t n = HeaderLength(file);
  return {reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n)};
}

// A file of `header` (padded to a multiple of 8) and `data`; when the header holds the checksum key
// once, its 16 digits are set to XXH3-64 of the file with them read as '0' (computed here,
// independently of the writer).
Bytes Seal(std::string header, std::span<const std::byte> data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  Bytes file(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i)
    file[i] = static_cast<std::byte>(std::uint64_t{header.size()} >> (8 * i));
  const std::size_t at = header.find(kKey);
  if (at != std::string::npos && header.find(kKey, at + 1) == std::string::npos) {
    header.replace(at + kKey.size(), 16, std::string(16, '0'));
  }
  std::memcpy(file.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(file.data() + 8 + header.size(), data.data(), data.size());
  if (at != std::string::npos && header.find(kKey, at + 1) == std::string::npos) {
    char digits[17];
    std::snprintf(digits, sizeof(digits), "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(file.data(), file.size())));
    std::memcpy(file.data() + 8 + at + kKey.size(), digits, 16);
  }
  return file;
}

// Whether `haystack` (an error message) contains `needle`, saying both when not.
::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "fopt_ckpt_XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // The names in the test directory, to find temporary files left behind.
  std::vector<std::string> Listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  // One tensor of every dtype, a 0-d one and two empty ones; an odd-sized U8 before wider types, so
  // offsets are not aligned (the format does not require it).
  void MakeTensors() {
    f32_ = AsBytes(std::vector<float>{1.5f, -2.f, 3.25f, 0.f, -0.f, 1e30f});
    f16_ = Iota(std::size_t{5} * 2, 3);
    bf16_ = Iota(std::size_t{3} * 2, 11);
    f64_ = AsBytes(std::vector<double>{3.141592653589793});
    i64_ = AsBytes(std::vector<std::int64_t>{-1, 0, 1LL << 62, 7});
    i32_ = AsBytes(std::vector<std::int32_t>{-5, 5});
    u8_ = Iota(3, 200);
    bool_ = Bytes{std::byte{1}, std::byte{0}};
    tensors_ = {
        {"state.0.exp_avg", "F32", {2, 3}, f32_}, {"state.0.odd", "U8", {3}, u8_},
        {"state.0.f16", "F16", {5}, f16_},        {"state.0.step", "F64", {}, f64_},
        {"state.1.empty", "F32", {0, 4}, {}},     {"state.1.bf16", "BF16", {3, 1}, bf16_},
        {"state.1.i64", "I64", {2, 2}, i64_},     {"state.2.empty", "I32", {0}, {}},
        {"state.2.i32", "I32", {2}, i32_},        {"state.2.flags", "BOOL", {2}, bool_},
    };
  }

  // Writes the tensors to `name` and returns its bytes.
  Bytes WriteGood(const std::string& name) {
    MakeTensors();
    WriteCheckpointFile(Path(name), kMetadata, tensors_);
    return Slurp(Path(name));
  }

  // The message of the CheckpointError that reading `bytes` (as a file) throws; "" when none is
  // thrown.
  std::string ReadError(std::span<const std::byte> bytes,
                        std::size_t max_header = kMaxCheckpointHeaderBytes) {
    const std::string path = Path("damaged.safetensors");
    Spill(path, bytes);
    try {
      ReadCheckpointFile(path, max_header);
    } catch (const CheckpointError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      return what;
    }
    return "";
  }

  // The good file with its header replaced by `edit(header as JSON)`, dumped compactly and
  // resealed.
  template <typename Edit>
  std::string EditedError(Edit edit) {
    const Bytes good = WriteGood("good.safetensors");
    Json header = Json::parse(HeaderText(good));
    edit(header);
    const Bytes data(good.begin() + 8 + static_cast<std::ptrdiff_t>(HeaderLength(good)),
                     good.end());
    return ReadError(Seal(header.dump(), data));
  }

  static constexpr std::string_view kMetadata =
      R"({"optimizer":"AdamW","lr":0.001,"note":"ünïcode"})";
  std::string dir_;
  Bytes f32_, f16_, bf16_, f64_, i64_, i32_, u8_, bool_;
  std::vector<CheckpointTensor> tensors_;
};

TEST_F(CheckpointFileTest, RoundTripOfEveryDtypeAndShape) {
  WriteGood("ckpt.safetensors");
  const CheckpointFile file = ReadCheckpointFile(Path("ckpt.safetensors"));
  EXPECT_EQ(file.metadata, kMetadata);
  ASSERT_EQ(file.tensors.size(), tensors_.size());
  std::size_t total = 0;
  for (const CheckpointTensor& t : tensors_) total += t.data.size();
  EXPECT_EQ(file.data.size(), total);
  // In the order of their data, which is the order written (the two empty tensors sit at distinct
  // offsets).
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const CheckpointTensor& want = tensors_[i];
    const CheckpointEntry& got = file.tensors[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    ASSERT_EQ(got.nbytes, want.data.size());
    ASSERT_LE(got.offset + got.nbytes, file.data.size());
    EXPECT_TRUE(std::equal(want.data.begin(), want.data.end(),
                           file.data.begin() + static_cast<std::ptrdiff_t>(got.offset)));
  }
  EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.safetensors"});  // no temporary file left
}

TEST_F(CheckpointFileTest, NoTensorsAndEmptyMetadata) {
  WriteCheckpointFile(Path("empty.safetensors"), "", {});
  const CheckpointFile file = ReadCheckpointFile(Path("empty.safetensors"));
  EXPECT_EQ(file.metadata, "");
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.data.empty());
}

TEST_F(CheckpointFileTest, RewriteReplacesTheFile) {
  WriteGood("ckpt.safetensors");
  const Bytes one = AsBytes(std::vector<float>{42.f});
  const std::vector<CheckpointTensor> other{{"x", "F32", {1}, one}};
  WriteCheckpointFile(Path("ckpt.safetensors"), "{}", other);
  const CheckpointFile file = ReadCheckpointFile(Path("ckpt.safetensors"));
  EXPECT_EQ(file.metadata, "{}");
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.data, one);
  EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.safetensors"});
}

// The bytes as the format says: a padded compact header starting with '{', the data 8-aligned and
// exactly the tensors end to end, the metadata as strings, and the checksum XXH3-64 of the file
// with its digits '0'.
TEST_F(CheckpointFileTest, LayoutAndChecksum) {
  const Bytes file = WriteGood("ckpt.safetensors");
  const std::uint64_t n = HeaderLength(file);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = HeaderText(file);
  EXPECT_EQ(header.front(), '{');
  const std::size_t at = header.find(kKey);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(header.find(kKey, at + 1), std::string::npos);
  EXPECT_EQ(header.find(": "), std::string::npos);  // compact
  const std::size_t end = header.find_last_not_of(' ');
  EXPECT_EQ(header[end], '}');
  EXPECT_LT(header.size() - end - 1, 8u);  // at most 7 spaces of padding

  const Json json = Json::parse(header);
  const Json& meta = json.at("__metadata__");
  EXPECT_EQ(meta.at("format").get<std::string>(), "fusedopt.checkpoint");
  EXPECT_EQ(meta.at("version").get<std::string>(), "1");
  EXPECT_EQ(meta.at("fusedopt").get<std::string>(), kMetadata);
  std::size_t offset = 0;
  for (const CheckpointTensor& t : tensors_) {
    const Json& e = json.at(t.name);
    EXPECT_EQ(e.at("dtype").get<std::string>(), t.dtype);
    EXPECT_EQ(e.at("shape").get<std::vector<std::int64_t>>(), t.shape);
    EXPECT_EQ(e.at("data_offsets"), Json({offset, offset + t.data.size()})) << t.name;
    offset += t.data.size();
  }
  EXPECT_EQ(file.size(), 8 + n + offset);

  Bytes zeroed = file;
  const std::size_t digits = 8 + at + kKey.size();
  std::memset(zeroed.data() + digits, '0', 16);  // NOLINT(bugprone-suspicious-memset-usage): text
  char want[17];
  std::snprintf(want, sizeof(want), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(zeroed.data(), zeroed.size())));
  EXPECT_EQ(header.substr(at + kKey.size(), 16), want);
  EXPECT_EQ(meta.at("checksum").get<std::string>(), std::string("xxh3-64:") + want);
  EXPECT_EQ(Seal(header, {}).size(), 8 + n);  // the test's sealer agrees with the writer
  EXPECT_EQ(Seal(header, std::span(file).subspan(8 + n)), file);
}

TEST_F(CheckpointFileTest, TruncationAtAnyLengthIsRejected) {
  const Bytes file = WriteGood("ckpt.safetensors");
  const std::size_t n = HeaderLength(file);
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
    EXPECT_TRUE(Contains(ReadError(std::span(file).first(len)), "empty or truncated"));
  }
  for (std::size_t len : {std::size_t{8}, std::size_t{9}, 8 + n / 2, 8 + n - 1}) {
    EXPECT_TRUE(Contains(ReadError(std::span(file).first(len)), "truncated"));
  }
  for (std::size_t len = 8 + n; len < file.size(); ++len) {  // every cut inside the data
    EXPECT_TRUE(Contains(ReadError(std::span(file).first(len)),
                         "checksum mismatch: the file is corrupted"));
  }
}

// Any byte changed, anywhere, in any way tried, is caught: by the checksum or by a format check.
TEST_F(CheckpointFileTest, EveryFlippedByteIsDetected) {
  const Bytes file = WriteGood("ckpt.safetensors");
  const std::string path = Path("flipped.safetensors");
  // The sanitizer run (slow) flips one bit of each byte, the others three patterns.
  const std::vector<unsigned> masks =
      test::SmallOnly() ? std::vector<unsigned>{0x01u} : std::vector<unsigned>{0x01u, 0x80u, 0xFFu};
  int mismatches = 0;
  for (std::size_t i = 0; i < file.size(); ++i) {
    for (const unsigned mask : masks) {
      Bytes bad = file;
      bad[i] ^= static_cast<std::byte>(mask);
      Spill(path, bad);
      try {
        ReadCheckpointFile(path);
        ADD_FAILURE() << "byte " << i << " ^ " << mask << " not detected";
      } catch (const CheckpointError& e) {
        mismatches += std::string(e.what()).find("checksum mismatch") != std::string::npos;
      }
    }
  }
  EXPECT_GT(mismatches,
            static_cast<int>(file.size() * masks.size() / 2));  // most are the checksum's
}

// Random damage (bytes overwritten, the header length changed, cuts) never escapes as anything but
// a CheckpointError; with the asan preset this also shows that no input makes the reader read out
// of bounds.
TEST_F(CheckpointFileTest, RandomDamageIsAlwaysACheckpointError) {
  const Bytes file = WriteGood("ckpt.safetensors");
  const std::string path = Path("random.safetensors");
  test::Rng rng(20261203);
  const int rounds = test::SmallOnly() ? 100 : 500;
  for (int round = 0; round < rounds; ++round) {
    Bytes bad = file;
    const std::uint64_t kind = rng.Next() % 4;
    if (kind == 0 || kind == 3) {  // overwrite 1-4 bytes
      for (std::uint64_t k = 0; k <= rng.Next() % 4; ++k) {
        bad[rng.Next() % bad.size()] = static_cast<std::byte>(rng.Next());
      }
    }
    if (kind == 1 || kind == 3) {  // a header length anywhere within the file, or anything at all
      const std::uint64_t n = rng.Next() % 2 ? rng.Next() % bad.size() : rng.Next();
      for (int i = 0; i < 8; ++i) bad[i] = static_cast<std::byte>(n >> (8 * i));
    }
    if (kind == 2) bad.resize(rng.Next() % bad.size());  // cut
    if (bad == file) continue;
    Spill(path, bad);
    EXPECT_THROW(ReadCheckpointFile(path), CheckpointError) << "round " << round;
  }
}

TEST_F(CheckpointFileTest, HeaderLengthField) {
  Bytes file = WriteGood("ckpt.safetensors");
  const auto set_length = [&](std::uint64_t n) {
    for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>(n >> (8 * i));
  };
  const std::uint64_t n = HeaderLength(file);
  set_length(file.size());  // past the end
  EXPECT_TRUE(Contains(ReadError(file), "truncated: a header of"));
  set_length(kMaxCheckpointHeaderBytes + 1);
  EXPECT_TRUE(
      Contains(ReadError(file), "a header of 104857601 bytes is over the limit of 104857600"));
  set_length(~std::uint64_t{0});
  EXPECT_TRUE(Contains(ReadError(file), "is over the limit"));
  set_length(0);
  EXPECT_TRUE(Contains(ReadError(file), "a header of 0 bytes"));
  set_length(n);
  EXPECT_EQ(ReadError(file, n), "");  // the limit is inclusive
  EXPECT_TRUE(Contains(
      ReadError(file, n - 1),
      "a header of " + std::to_string(n) + " bytes is over the limit of " + std::to_string(n - 1)));
}

TEST_F(CheckpointFileTest, TextAndEmptyFiles) {
  const std::string text = "This is not a checkpoint.\nJust some text in a file.\n";
  const std::string what = ReadError(std::as_bytes(std::span(text)));
  EXPECT_TRUE(Contains(what, "is over the limit"));
  EXPECT_TRUE(Contains(what, "not a safetensors file"));
  EXPECT_TRUE(Contains(ReadError({}), "empty or truncated: 0 bytes"));
  const std::string json = R"({"a": 1})";  // short text
  EXPECT_TRUE(Contains(ReadError(std::as_bytes(std::span(json))), "header of"));
  // A safetensors file from elsewhere.
  const Bytes data = AsBytes(std::vector<float>{1.f});
  EXPECT_TRUE(
      Contains(ReadError(Seal(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data)),
               "not a fusedopt checkpoint"));
  EXPECT_TRUE(Contains(ReadError(Seal(R"({"__metadata__":{"format":"pt"}})", {})),
                       "not a fusedopt checkpoint"));
}

TEST_F(CheckpointFileTest, FormatAndVersion) {
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"]["version"] = "2"; }),
                       "format version 2; this fusedopt reads version 1"));
  // A newer version is named as such even when its checksum differs from this version's.
  {
    const Bytes good = WriteGood("good.safetensors");
    std::string header = HeaderText(good);
    header.replace(header.find(R"("version":"1")"), 13, R"("version":"7")");
    Bytes bad = good;
    std::memcpy(bad.data() + 8, header.data(), header.size());
    EXPECT_TRUE(Contains(ReadError(bad), "format version 7; this fusedopt reads version 1"));
  }
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"].erase("version"); }),
                       R"(no "version")"));
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"]["version"] = 1; }),
                       R"("version" is not a string)"));
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"]["format"] = "other"; }),
                       "not a fusedopt checkpoint (format \"other\""));
  EXPECT_TRUE(
      Contains(EditedError([](Json& h) { h["__metadata__"].erase("format"); }), R"(no "format")"));
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"].erase("fusedopt"); }),
                       R"(no "fusedopt")"));
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"]["extra"] = Json::array(); }),
                       R"("extra" is not a string)"));
  EXPECT_EQ(EditedError([](Json& h) { h["__metadata__"]["extra"] = "fine"; }), "");
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"] = "x"; }), "no __metadata__"));
}

TEST_F(CheckpointFileTest, Checksum) {
  const Bytes good = WriteGood("good.safetensors");
  const std::string header = HeaderText(good);
  const std::size_t digits = 8 + header.find(kKey) + kKey.size();
  {
    Bytes bad = good;
    bad.back() ^= std::byte{1};
    const std::string stored = header.substr(digits - 8, 16);
    const std::string what = ReadError(bad);
    EXPECT_TRUE(Contains(
        what, "checksum mismatch: the file is corrupted (stored " + stored + ", computed "));
  }
  {
    Bytes bad = good;
    bad[digits] = std::byte{'A'};  // not lowercase hex
    EXPECT_TRUE(Contains(ReadError(bad), "malformed checksum"));
  }
  {
    Bytes bad = good;
    bad[digits + 16] = std::byte{'0'};  // a 17th digit
    EXPECT_TRUE(Contains(ReadError(bad), "malformed checksum"));
  }
  EXPECT_TRUE(
      Contains(EditedError([](Json& h) { h["__metadata__"].erase("checksum"); }), "no checksum"));
  EXPECT_TRUE(Contains(EditedError([](Json& h) { h["__metadata__"]["checksum"] = "sha256:00"; }),
                       "no checksum"));
  EXPECT_TRUE(Contains(
      EditedError([](Json& h) { h["state.0.odd"]["checksum"] = "xxh3-64:0000000000000000"; }),
      "the checksum occurs 2 times"));
}

TEST_F(CheckpointFileTest, MalformedHeaders) {
  const std::string key =
      R"("__metadata__":{"checksum":"xxh3-64:0000000000000000","format":"fusedopt.checkpoint","fusedopt":"","version":"1"})";
  EXPECT_EQ(ReadError(Seal("{" + key + "}", {})), "");
  EXPECT_TRUE(Contains(ReadError(Seal("{" + key + ",}", {})), "not valid JSON"));
  EXPECT_TRUE(Contains(ReadError(Seal("{" + key + "} x", {})), "not valid JSON"));
  EXPECT_TRUE(Contains(ReadError(Seal("[{" + key + "}]", {})), "not a JSON object"));
  EXPECT_TRUE(Contains(ReadError(Seal("{" + key + ",\"bad\":\"\xff\"}", {})),
                       "not valid JSON"));  // not UTF-8
  EXPECT_TRUE(
      Contains(ReadError(Seal("{" + key + R"(,"t":7})", {})), "tensor 't': not a JSON object"));
  // A name twice: nlohmann would keep the last one silently.
  const std::string t = R"("t":{"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
  EXPECT_EQ(ReadError(Seal("{" + key + "," + t + "}", {})), "");
  EXPECT_TRUE(Contains(ReadError(Seal("{" + key + "," + t + "," + t + "}", {})),
                       "tensor name 't' occurs twice"));
  EXPECT_TRUE(Contains(
      ReadError(Seal(
          "{" + key + R"(,"t":{"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]}})", {})),
      "key 'dtype' occurs twice"));
}

TEST_F(CheckpointFileTest, TensorEntries) {
  const auto entry = [](Json& h) -> Json& { return h["state.0.odd"]; };  // U8 [3] at [24, 27)
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h)["dtype"] = "F8_E4M3"; }),
                       "unknown dtype 'F8_E4M3'"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h)["dtype"] = 1; }), "no dtype string"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) {
                         h[""] = entry(h);
                         h.erase("state.0.odd");
                       }),
                       "a tensor with an empty name"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h).erase("shape"); }), "no shape list"));
  EXPECT_TRUE(
      Contains(EditedError([&](Json& h) { entry(h)["shape"] = {-3}; }), "a negative dimension"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h)["shape"] = {1.5}; }),
                       "not a list of non-negative"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h)["shape"] = {"3"}; }),
                       "not a list of non-negative"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h)["shape"] = {std::uint64_t{1} << 63}; }),
                       "not a list of non-negative"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) {
                         entry(h)["shape"] = {1LL << 40, 1LL << 40};
                       }),
                       "overflows"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) { entry(h)["shape"] = {1}; }),
                       "hold 3 bytes, its dtype and shape take 1"));
  EXPECT_TRUE(
      Contains(EditedError([&](Json& h) { entry(h)["data_offsets"] = {24}; }), "no data_offsets"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) {
                         entry(h)["data_offsets"] = {-1, 2};
                       }),
                       "no data_offsets"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) {
                         entry(h)["data_offsets"] = {27, 24};
                       }),
                       "begin after end"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) {
                         entry(h)["data_offsets"] = {1000, 1003};
                       }),
                       "end past the 93-byte data section"));
  EXPECT_TRUE(Contains(EditedError([&](Json& h) {
                         entry(h)["data_offsets"] = {~std::uint64_t{0} - 1, ~std::uint64_t{0}};
                       }),
                       "end past"));
  EXPECT_TRUE(
      Contains(EditedError([&](Json& h) { entry(h)["extra"] = 1; }), "unknown field 'extra'"));
}

TEST_F(CheckpointFileTest, OffsetsMustCoverTheDataExactly) {
  // Overlap: the U8 tensor moved back into the F32 before it (and a hole where it was).
  EXPECT_TRUE(Contains(EditedError([](Json& h) {
                         h["state.0.odd"]["data_offsets"] = {20, 23};
                       }),
                       "tensors overlap"));
  // Two tensors on the same bytes.
  EXPECT_TRUE(Contains(EditedError([](Json& h) {
                         h["state.0.f16"]["data_offsets"] = {0, 10};
                       }),
                       "overlap"));
  // A hole: the bytes of a tensor dropped from the header.
  EXPECT_TRUE(
      Contains(EditedError([](Json& h) { h.erase("state.0.odd"); }), "a hole between tensors"));
  // Bytes after the last tensor.
  EXPECT_TRUE(
      Contains(EditedError([](Json& h) { h.erase("state.2.flags"); }), "bytes no tensor holds"));
  // Empty tensors may sit anywhere in range, also on another tensor's first byte.
  EXPECT_EQ(EditedError([](Json& h) { h["state.1.empty"]["data_offsets"] = {0, 0}; }), "");
  EXPECT_EQ(EditedError([](Json& h) { h["state.1.empty"]["data_offsets"] = {93, 93}; }), "");
}

TEST_F(CheckpointFileTest, ReadErrorsOfTheFileSystem) {
  try {
    ReadCheckpointFile(Path("missing.safetensors"));
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_TRUE(Contains(e.what(), Path("missing.safetensors")));
    EXPECT_TRUE(Contains(e.what(), "No such file or directory"));
  }
  EXPECT_THROW(ReadCheckpointFile(dir_), CheckpointError);  // a directory
}

TEST_F(CheckpointFileTest, BadWriterArgumentsMakeNoFile) {
  MakeTensors();
  const auto expect_invalid = [&](std::vector<CheckpointTensor> tensors, const std::string& needle,
                                  std::string_view metadata = "{}") {
    try {
      WriteCheckpointFile(Path("ckpt.safetensors"), metadata, tensors);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {  // fusedopt::Error, a std::invalid_argument
      EXPECT_TRUE(Contains(e.what(), needle));
    }
    EXPECT_TRUE(Listing().empty());
  };
  const Bytes four(4);
  expect_invalid({{"w", "F8_E4M3", {4}, four}}, "tensor 'w': dtype 'F8_E4M3'");
  expect_invalid({{"w", "F32", {2}, four}},
                 "tensor 'w': 4 bytes of data, its shape and dtype take 8");
  expect_invalid({{"w", "F32", {}, {}}}, "tensor 'w': 0 bytes");
  expect_invalid({{"w", "F32", {-1}, four}}, "tensor 'w': a negative");
  expect_invalid({{"w", "U8", {4}, four}, {"w", "U8", {4}, four}},
                 "tensor 'w': the name occurs twice");
  expect_invalid({{"", "U8", {4}, four}}, "empty name");
  expect_invalid({{"__metadata__", "U8", {4}, four}}, "reserved");
  expect_invalid({{"w\xff", "U8", {4}, four}}, "not UTF-8");
  expect_invalid({}, "not UTF-8", "\xc3");
  EXPECT_THROW(WriteCheckpointFile("", "{}", {}), std::invalid_argument);
}

TEST_F(CheckpointFileTest, WriteIntoAMissingDirectory) {
  const std::string path = Path("no/such/dir/ckpt.safetensors");
  try {
    WriteCheckpointFile(path, "{}", {});
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_TRUE(Contains(e.what(), path));
    EXPECT_TRUE(Contains(e.what(), "No such file or directory"));
  }
  EXPECT_TRUE(Listing().empty());
}

// A directory where the file should go: the rename fails, the directory stays, the temporary file
// goes.
TEST_F(CheckpointFileTest, RenameOverADirectoryFails) {
  fs::create_directory(Path("ckpt.safetensors"));
  EXPECT_THROW(WriteCheckpointFile(Path("ckpt.safetensors"), "{}", {}), std::system_error);
  EXPECT_TRUE(fs::is_directory(Path("ckpt.safetensors")));
  EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.safetensors"});
}

// A write that runs out of room (EFBIG from RLIMIT_FSIZE, as ENOSPC would) in a child process: the
// error names the path and errno, the old checkpoint is whole, and no temporary file is left.
TEST_F(CheckpointFileTest, FailedWriteLeavesTheOldFileWhole) {
  const Bytes old = WriteGood("ckpt.safetensors");
  const std::string path = Path("ckpt.safetensors");
  const Bytes big = Iota(256 << 10, 1);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 64 << 10;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    const std::vector<CheckpointTensor> tensors{
        {"big", "U8", {static_cast<std::int64_t>(big.size())}, big}};
    try {
      WriteCheckpointFile(path, "{}", tensors);
    } catch (const std::system_error& e) {
      const std::string what = e.what();
      if (e.code().value() != EFBIG) ::_exit(11);
      if (what.find(path) == std::string::npos ||
          what.find(std::strerror(EFBIG)) == std::string::npos) {
        ::_exit(12);
      }
      ::_exit(0);
    } catch (...) {
      ::_exit(13);
    }
    ::_exit(14);  // no error
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: setrlimit, 11: errno, 12: message, 13: other error, 14: no error";
  EXPECT_EQ(Slurp(path), old);
  EXPECT_NO_THROW(ReadCheckpointFile(path));
  EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.safetensors"});
}

}  // namespace
}  // namespace fusedopt
