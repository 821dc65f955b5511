// The test-only oracle of every algorithm: tests/reference/common.h and one file per algorithm,
// tests/reference/<algo>.h (its update rule in double and its cases), each included here by the
// build's list (cmake/FoptIncludeList.cmake), so that adding an algorithm's file is all it takes.
#pragma once

#include "fopt_generated/references.h"  // every tests/reference/<algo>.h
#include "tests/reference/common.h"
