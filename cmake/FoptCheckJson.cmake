# JSON checks for the CLI tests' `cmake -P` scripts (bench/CMakeLists.txt, tools/train/CMakeLists.txt),
# which include this file: string(JSON) instead of a Python dependency.

# expect_key(<json> <expected value or *> <path...>): the key exists (and has that value).
function(expect_key json expected)
  string(JSON value ERROR_VARIABLE error GET "${json}" ${ARGN})
  if(error)
    message(FATAL_ERROR "JSON key ${ARGN} missing: ${error}")
  endif()
  if(expected MATCHES "^-?[0-9.]+$")
    if(NOT value EQUAL expected)
      message(FATAL_ERROR "JSON key ${ARGN} is '${value}', expected ${expected}")
    endif()
  elseif(NOT expected STREQUAL "*" AND NOT value STREQUAL expected)
    message(FATAL_ERROR "JSON key ${ARGN} is '${value}', expected '${expected}'")
  endif()
endfunction()

function(expect_null json)
  string(JSON type ERROR_VARIABLE error TYPE "${json}" ${ARGN})
  if(error OR NOT type STREQUAL "NULL")
    message(FATAL_ERROR "JSON key ${ARGN} should be null (${type}${error})")
  endif()
endfunction()

function(expect_no_key json)
  string(JSON value ERROR_VARIABLE error GET "${json}" ${ARGN})
  if(NOT error)
    message(FATAL_ERROR "JSON key ${ARGN} should be absent, is '${value}'")
  endif()
endfunction()
