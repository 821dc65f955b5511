# ctest install.find_package: installs the build into a fresh prefix with `cmake --install`, then
# configures, builds and runs tests/install/consumer out of tree against it with
# find_package(fusedopt REQUIRED), as a user's project would. -D: BUILD_DIR, SOURCE_DIR, WORK_DIR,
# GENERATOR, WITH_TORCH (ON/OFF), TORCH_DIR (Torch's CMake config folder), WITH_MPI (ON/OFF).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(out "${out}" PARENT_SCOPE)
endfunction()

run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(file include/fusedopt/optimizer.h lib/libfusedopt.a bin/fusedopt
             lib/cmake/fusedopt/fusedoptConfig.cmake lib/cmake/fusedopt/fusedoptConfigVersion.cmake)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "cmake --install did not install ${file}")
  endif()
endforeach()
if(WITH_MPI)
  foreach(file include/fusedopt/mpi_communicator.h lib/libfusedopt_mpi.a
               lib/cmake/fusedopt/fusedopt-mpi-targets.cmake)
    if(NOT EXISTS ${prefix}/${file})
      message(FATAL_ERROR "cmake --install did not install ${file}")
    endif()
  endforeach()
endif()

run("configure the consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer
    -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DWITH_TORCH=${WITH_TORCH}
    -DWITH_MPI=${WITH_MPI} -DCMAKE_PREFIX_PATH=${prefix} -DTorch_DIR=${TORCH_DIR})
run("build the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("run the consumer" ${WORK_DIR}/build/consumer)
if(WITH_MPI)
  run("run the MPI consumer (one process)" ${WORK_DIR}/build/consumer_mpi)
endif()
if(WITH_TORCH)
  run("run the torch consumer" ${WORK_DIR}/build/consumer_torch)
endif()
run("the installed CLI" ${prefix}/bin/fusedopt info)
