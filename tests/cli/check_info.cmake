# cli.info_bandwidth: `fusedopt info --bandwidth` on small arrays (--bandwidth-mib 8, so the test is
# fast; the numbers are then cache speeds): the array size and the read, write and copy lines,
# each a positive GB/s naming both store kinds; a bad size is exit code 2 naming the option.
# Timings are never asserted. Run with -DFUSEDOPT=<the CLI> -DWORK_DIR=<a scratch dir>
# -DFOPT_CMAKE_DIR=<cmake/>.
include(${FOPT_CMAKE_DIR}/FoptCheckJson.cmake)

# Without --bandwidth: nothing measured.
expect_exit(0 "" ${FUSEDOPT} info)
if(out MATCHES "bandwidth")
  message(FATAL_ERROR "fusedopt info measures bandwidth without --bandwidth:\n${out}")
endif()

expect_exit(0 "" ${FUSEDOPT} info --bandwidth --bandwidth-mib 8)
set(gbps "[0-9]+\\.[0-9] GB/s")
foreach(regex "bandwidth: STREAM-style, 8 MiB f32 arrays, [0-9]+ threads, best of [0-9]+"
              "\n  read +${gbps}"
              "\n  write +${gbps}  \\(fill of one array; store [0-9.]+, stream [0-9.]+\\)"
              "\n  copy +${gbps}  \\(bytes read \\+ written; store [0-9.]+, stream [0-9.]+\\)")
  if(NOT out MATCHES "${regex}")
    message(FATAL_ERROR "fusedopt info --bandwidth: no match for '${regex}' in:\n${out}")
  endif()
endforeach()
if(out MATCHES " 0\\.0 GB/s|nan|inf")
  message(FATAL_ERROR "fusedopt info --bandwidth: a zero or non-finite rate:\n${out}")
endif()

expect_exit(2 "--bandwidth-mib" ${FUSEDOPT} info --bandwidth --bandwidth-mib 0)
expect_exit(2 "--bandwidth-mib" ${FUSEDOPT} info --bandwidth --bandwidth-mib abc)
