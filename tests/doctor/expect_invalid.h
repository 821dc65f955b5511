// A check shared by the doctor's gtest files: a call that must throw std::invalid_argument naming
// the bad option and value.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace fusedopt::test {

// Expects std::invalid_argument whose message contains every one of `parts`.
template <class F>
void ExpectInvalid(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace fusedopt::test
