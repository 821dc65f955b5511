// fusedopt/pt/timeline.h: spans in memory, written once as Chrome trace-event JSON.

#include "fusedopt/pt/timeline.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fusedopt::pt {
namespace {

// Our names are plain identifiers and labels; escape what JSON requires anyway.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3f", value);
  return buffer;
}

}  // namespace

Timeline::ScopedSpan::ScopedSpan(Timeline* timeline, int pid, std::string name, std::int64_t step)
    : timeline_(timeline), pid_(pid), name_(std::move(name)), step_(step), begin_(Clock::now()) {}

double Timeline::ScopedSpan::End() {
  if (ended_) return 0.0;
  ended_ = true;
  const Clock::time_point end = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(end - begin_).count();
  if (timeline_ != nullptr) {
    timeline_->Record({pid_, std::move(name_), step_, timeline_->MicrosecondsSinceStart(begin_),
                       ms * 1000.0, std::nullopt});
  }
  return ms;
}

int Timeline::AddProcess(const std::string& impl, const std::string& label) {
  const int pid = static_cast<int>(processes_.size()) + 1;
  processes_[pid] = {impl, label};
  return pid;
}

void Timeline::SetWarmup(int pid, std::int64_t step, bool warmup) {
  for (Event& event : events_) {
    if (event.pid == pid && event.step == step && event.name == "step") event.warmup = warmup;
  }
}

double Timeline::MicrosecondsSinceStart(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

std::string Timeline::ToJson(const std::string& other_data_json) const {
  std::ostringstream out;
  out << "{\"displayTimeUnit\": \"ms\",\n \"otherData\": ";
  // Splice our two keys into the caller's object: `{` + ours + (`,` + theirs | `}`).
  const std::size_t open = other_data_json.find('{');
  if (open == std::string::npos)
    throw std::invalid_argument("Timeline: otherData must be an object");
  std::string impls = "{";
  for (const auto& [pid, names] : processes_) {
    impls +=
        (impls.size() > 1 ? ", " : "") + Quoted(std::to_string(pid)) + ": " + Quoted(names.first);
  }
  impls += "}";
  const std::string rest = other_data_json.substr(open + 1);
  const bool empty = rest.find_first_not_of(" \n\t}") == std::string::npos;
  out << "{\"fusedopt_trace\": 1, \"impls\": " << impls << (empty ? "}" : ", " + rest);
  out << ",\n \"traceEvents\": [";
  bool first = true;
  const auto separator = [&] {
    out << (first ? "\n  " : ",\n  ");
    first = false;
  };
  for (const auto& [pid, names] : processes_) {
    separator();
    out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid
        << ", \"tid\": 0, \"args\": {\"name\": " << Quoted(names.second) << "}}";
  }
  for (const Event& event : events_) {
    separator();
    out << "{\"name\": " << Quoted(event.name)
        << ", \"cat\": \"train\", \"ph\": \"X\", \"pid\": " << event.pid
        << ", \"tid\": 1, \"ts\": " << Number(event.ts_us) << ", \"dur\": " << Number(event.dur_us)
        << ", \"args\": {\"step\": " << event.step;
    if (event.warmup.has_value()) out << ", \"warmup\": " << (*event.warmup ? "true" : "false");
    out << "}}";
  }
  out << "\n]}\n";
  return out.str();
}

void Timeline::Write(const std::string& path, const std::string& other_data_json) const {
  std::ofstream file(path);
  if (file) {
    file << ToJson(other_data_json);
    file.close();  // flushes: a full disk shows here
  }
  if (!file) {
    throw std::runtime_error("cannot write the trace file '" + path + "': " + std::strerror(errno));
  }
}

}  // namespace fusedopt::pt
