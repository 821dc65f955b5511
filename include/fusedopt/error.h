// The one exception type of the public API: a rejected call names the offending argument and value,
// and has changed nothing.
#pragma once

#include <stdexcept>
#include <string>

namespace fusedopt {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace fusedopt
