// src/tool_util/report_util.h.

#include "src/tool_util/report_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "fusedopt/dtype.h"

namespace fusedopt::tools {

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double TrimmedMean(std::vector<double> values, double trim) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const auto drop = static_cast<std::size_t>(static_cast<double>(values.size()) * trim);
  double sum = 0.0;
  for (std::size_t i = drop; i < values.size() - drop; ++i) sum += values[i];
  return sum / static_cast<double>(values.size() - 2 * drop);
}

std::string Fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

std::string Num(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string FormatCount(std::size_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::size_t CheckedMul(std::size_t a, std::size_t b, const std::string& what) {
  std::size_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw std::invalid_argument(what + ": too large (" + std::to_string(a) + " x " +
                                std::to_string(b) + " does not fit in 64 bits)");
  }
  return product;
}

std::size_t CheckedAdd(std::size_t a, std::size_t b, const std::string& what) {
  std::size_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw std::invalid_argument(what + ": too large (" + std::to_string(a) + " + " +
                                std::to_string(b) + " does not fit in 64 bits)");
  }
  return sum;
}

void CheckFitsInMemory(std::size_t bytes, const std::string& what) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return;  // unknown: let the allocation decide
  const auto memory = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
  if (bytes <= memory) return;
  constexpr std::size_t kGiB = std::size_t{1} << 30;
  throw std::invalid_argument(what + ": needs " + std::to_string((bytes + kGiB - 1) / kGiB) +
                              " GiB, this machine has " + std::to_string(memory / kGiB) + " GiB");
}

namespace {

[[noreturn]] void CannotWrite(const std::string& path, int error) {
  throw std::runtime_error("cannot write '" + path + "': " + std::strerror(error));
}

// Writes all of `text` to `fd`; false (errno set) on failure.
bool WriteAll(int fd, const std::string& text) {
  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

void WriteTextFile(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path target(path);
  if (fs::is_symlink(fs::symlink_status(target, error))) {
    target = fs::canonical(target, error);  // replace the file it points to, not the link
    if (error) CannotWrite(path, error.value());
  }
  const fs::file_status status = fs::status(target, error);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) CannotWrite(path, errno);
    const bool written = WriteAll(fd, text);
    const int write_error = errno;
    if (::close(fd) != 0 && written) CannotWrite(path, errno);
    if (!written) CannotWrite(path, write_error);
    return;
  }
  if (!target.parent_path().empty()) {
    fs::create_directories(target.parent_path(), error);
    if (error) CannotWrite(path, error.value());
  }
  // In the same folder: rename() is atomic only within one file system.
  static std::atomic<unsigned> counter{0};
  const std::string temp =
      target.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) CannotWrite(path, errno);
  // fsync: a full disk or a failing device reports here, not after the rename.
  bool ok = WriteAll(fd, text) && ::fsync(fd) == 0;
  int reason = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    reason = errno;
  }
  if (ok && ::rename(temp.c_str(), target.c_str()) != 0) {
    ok = false;
    reason = errno;
  }
  if (!ok) {
    ::unlink(temp.c_str());
    CannotWrite(path, reason);
  }
}

void CheckWritable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::is_directory(status)) CannotWrite(path, EISDIR);
  if (fs::exists(status)) {
    if (::access(path.c_str(), W_OK) != 0) CannotWrite(path, errno);
    return;
  }
  // The nearest existing folder above it: WriteTextFile creates the missing ones in there.
  fs::path dir = fs::path(path).parent_path();
  while (!dir.empty() && !fs::exists(dir, error)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, error)) CannotWrite(path, ENOTDIR);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) CannotWrite(path, errno);
}

void Fill(void* data, DType dtype, std::size_t n, float scale, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1u;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;  // Numerical Recipes' LCG
    StoreFromF32(data, dtype, i, scale * (static_cast<float>(x >> 8) * 0x1p-23f - 1.0f));
  }
}

}  // namespace fusedopt::tools
