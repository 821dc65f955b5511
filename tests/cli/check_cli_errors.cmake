# cli.errors: `fusedopt bench`, `doctor` and `info` on bad input (issue #11, items 1, 9, 10, 21).
# Impossible sizes are exit code 2 with a message naming the option (never a crash); a report that
# cannot be written is an error naming the path (exit code != 0); an unknown FOPT_DISABLE_TARGETS
# name is an error listing the valid ones. Run with -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir>
# -DFOPT_CMAKE_DIR=<cmake/> -DTRACE=<a valid tiny trace>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)
set(dir ${WORK_DIR}/cli_errors)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})

# Sizes: a negative count (which CLI11 used to wrap to 2^64-1), counts whose byte size overflows,
# one past 2^64, and one that is representable but larger than the machine's memory.
foreach(n -1 4611686018427387904 18446744073709551615 18446744073709551616 0)
  expect_exit(2 "--numel.*${n}" ${FUSEDOPT} bench --numel ${n} --rounds 1)
endforeach()
expect_exit(2 "--numel.*needs [0-9]+ GiB" ${FUSEDOPT} bench --numel 10000000000000 --rounds 1)
expect_exit(2 "--numels.*'-5'" ${FUSEDOPT} doctor --numels -5 --step-ms 10 --rounds 1)
expect_exit(2 "--numels.*'-5'" ${FUSEDOPT} doctor --numels 300,-5 --step-ms 10 --rounds 1)
expect_exit(2 "--numels.*4611686018427387904" ${FUSEDOPT} doctor --numels 4611686018427387904
            --step-ms 10 --rounds 1)
expect_exit(2 "--numels.*needs [0-9]+ GiB" ${FUSEDOPT} doctor --numels 300,1000000000000
            --step-ms 10 --rounds 1)
expect_exit(2 "--threads.*1000000000" ${FUSEDOPT} doctor --numels 300 --step-ms 10 --threads
            1000000000)
expect_exit(2 "--weight-decay.*nan" ${FUSEDOPT} doctor --numels 300 --step-ms 10 --weight-decay nan)
# An unknown optimizer: bench and doctor name it and list the known ones, up front.
expect_exit(2 "--optimizer: adafactors not in .*adafactor" ${FUSEDOPT} bench --optimizer adafactors
            --numel 1000 --rounds 1)
expect_exit(2 "--optimizer: adafactors not in .*adafactor" ${FUSEDOPT} doctor --optimizer
            adafactors --numels 300 --step-ms 10 --rounds 1)
# ... with a trace too, where --optimizer overrides the trace's; a trace's own unknown name is the
# trace's error, not --optimizer's (issue #29, item 13).
expect_exit(2 "--optimizer: bogus not in .*adafactor" ${FUSEDOPT} doctor --trace ${TRACE}
            --optimizer bogus --rounds 1)

# Traces: impossible sizes (the sum of two 2^63-1 wraps around), nonsense threads, an unknown
# format version. Each is the valid tiny trace with one field changed.
file(READ ${TRACE} trace)
function(bad_trace name field value regex)
  string(JSON changed SET "${trace}" otherData ${field} "${value}")
  file(WRITE ${dir}/${name}.json "${changed}")
  expect_exit(2 "${regex}" ${FUSEDOPT} doctor --trace ${dir}/${name}.json --rounds 1)
endfunction()
bad_trace(huge param_numels "[4611686018427387904]" "param_numels")
bad_trace(wraps param_numels "[9223372036854775807, 9223372036854775807]" "param_numels")
bad_trace(threads threads "1e9" "otherData.threads.*1e\\+09")
bad_trace(version fusedopt_trace "99" "fusedopt_trace.*99")
bad_trace(optimizer optimizer "\"bogus\"" "otherData.optimizer is 'bogus', not one of .*adafactor: give --optimizer")

# Report files: a full device, and a folder that cannot be created (below a regular file; this
# works as root too). Never "wrote ...", never exit 0, and no temporary file left behind.
file(WRITE ${dir}/a_file "")
set(tiny_bench bench --numel 1000 --rounds 1 --warmup 0)
set(tiny_doctor doctor --numels 300 --step-ms 10 --optimizer-ms 1 --rounds 1)
foreach(command tiny_bench tiny_doctor)
  foreach(path /dev/full ${dir}/a_file/sub/report.json)
    expect_exit(NONZERO "error: .*${path}.*(No space left on device|Not a directory)"
                ${FUSEDOPT} ${${command}} --json ${path})
    if(out MATCHES "wrote")
      message(FATAL_ERROR "${command} --json ${path} says it wrote the file:\n${out}")
    endif()
  endforeach()
  # A good path: written through a temporary file renamed into place.
  expect_exit(0 "" ${FUSEDOPT} ${${command}} --json ${dir}/${command}.json)
  file(READ ${dir}/${command}.json json)
  expect_key("${json}" "*" threads)
endforeach()
file(GLOB leftovers ${dir}/*.tmp*)
if(leftovers)
  message(FATAL_ERROR "temporary files left behind: ${leftovers}")
endif()

# FOPT_DISABLE_TARGETS: an unknown name is an error naming it and listing the valid names.
expect_exit(2 "FOPT_DISABLE_TARGETS.*NOT_A_TARGET.*valid.*AVX2" ${CMAKE_COMMAND} -E env
            FOPT_DISABLE_TARGETS=NOT_A_TARGET ${FUSEDOPT} info)
expect_exit(2 "FOPT_DISABLE_TARGETS.*NOT_A_TARGET" ${CMAKE_COMMAND} -E env
            FOPT_DISABLE_TARGETS=AVX2,NOT_A_TARGET ${FUSEDOPT} ${tiny_bench})
expect_exit(0 "" ${CMAKE_COMMAND} -E env FOPT_DISABLE_TARGETS=AVX2 ${FUSEDOPT} info)

# The human-readable target names say what AVX3 is (docs/cli.md's AVX-512).
expect_exit(0 "" ${FUSEDOPT} info)
if(out MATCHES "AVX3" AND NOT out MATCHES "AVX3 \\(AVX-512\\)")
  message(FATAL_ERROR "fusedopt info prints AVX3 without (AVX-512):\n${out}")
endif()
