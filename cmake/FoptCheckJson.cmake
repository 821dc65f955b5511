# JSON checks for the CLI tests' `cmake -P` scripts (tests/cli/*.cmake),
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

# expect_exit(<expected rc or NONZERO> <stderr regex> <command...>): runs the command and checks
# that it exited normally (a crash, e.g. "Segmentation fault", is never accepted) with exactly
# that code (NONZERO: any code but 0) and that its stderr matches the regex. Leaves `out` and `err`
# (stdout, stderr) in the caller's scope.
function(expect_exit expected regex)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  set(what "${ARGN}: expected exit ${expected} and stderr matching '${regex}', got '${rc}'")
  if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "${what} (a crash):\n${stdout}\n${stderr}")
  endif()
  if(expected STREQUAL "NONZERO")
    if(rc EQUAL 0)
      message(FATAL_ERROR "${what}:\n${stdout}\n${stderr}")
    endif()
  elseif(NOT rc EQUAL expected)
    message(FATAL_ERROR "${what}:\n${stdout}\n${stderr}")
  endif()
  if(NOT stderr MATCHES "${regex}")
    message(FATAL_ERROR "${what}:\n${stdout}\n${stderr}")
  endif()
  set(out "${stdout}" PARENT_SCOPE)
  set(err "${stderr}" PARENT_SCOPE)
endfunction()
