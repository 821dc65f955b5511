// What the doctor reports: the table of the standard and fused steps against the ceiling, and the
// verdict in plain language.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "src/doctor/doctor.h"

namespace fusedopt::doctor {

// A duration in ms with enough digits to be read: 2 decimals from 1 ms, 3 significant digits below.
std::string Ms(double ms);

// {"ops", "passes", "bytes"} of a count.
nlohmann::json CountJson(const OpCount& c);

// The numbers the verdict is made of.
struct Findings {
  bool already_fused;
  double share;         // optimizer_ms / step_ms
  double amdahl_bound;  // step / (step - optimizer): removing the optimizer entirely
  double optimizer_ms;
  double fused_ms;
  double predicted_step_ms;
  double predicted_speedup;
  double standard_gb_per_s;
  double ceiling_gb_per_s;
  double same_traffic_ms;
  std::optional<double> standard_ms;  // timed here
  OpCount standard;
  OpCount fused;
};

// The seeds' troubleshooting, in plain language: how much of the step the optimizer is, what
// fusing can save at most and what it will save, and where to look instead when that is little.
std::string Verdict(const Findings& f);

// The table: the standard step (the user's, or timed here), fusedopt and the ceiling.
void PrintTable(std::ostream& out, const Findings& f, const std::string& optimizer_source);

}  // namespace fusedopt::doctor
