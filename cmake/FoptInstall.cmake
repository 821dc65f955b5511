# `cmake --install`: the public headers, libfusedopt (fusedopt::core), the MPI communicator
# libfusedopt_mpi (fusedopt::mpi) and the libtorch adapter libfusedopt_torch (fusedopt::torch) when
# they are built, the fusedopt CLI, and the CMake package a consumer finds with
# find_package(fusedopt) (tests/install checks it from outside the tree).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(fopt_package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/fusedopt)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/fusedopt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS fusedopt_core EXPORT fusedopt-targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT fusedopt-targets NAMESPACE fusedopt:: DESTINATION ${fopt_package_dir})
export(EXPORT fusedopt-targets NAMESPACE fusedopt:: FILE ${PROJECT_BINARY_DIR}/fusedopt-targets.cmake)

# The adapter in an export set of its own: a consumer without libtorch still gets fusedopt::core.
if(TARGET fusedopt_torch)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/torch/include/fusedopt
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS fusedopt_torch EXPORT fusedopt-torch-targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT fusedopt-torch-targets NAMESPACE fusedopt:: DESTINATION ${fopt_package_dir})
endif()

# The MPI communicator, as the adapter: its own export set, so a consumer without MPI still gets
# fusedopt::core.
if(TARGET fusedopt_mpi)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/mpi/include/fusedopt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS fusedopt_mpi EXPORT fusedopt-mpi-targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT fusedopt-mpi-targets NAMESPACE fusedopt:: DESTINATION ${fopt_package_dir})
endif()

if(TARGET fusedopt)
  install(TARGETS fusedopt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/fusedopt-config.cmake.in
                              ${PROJECT_BINARY_DIR}/fusedoptConfig.cmake
                              INSTALL_DESTINATION ${fopt_package_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fusedoptConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fusedoptConfig.cmake ${PROJECT_BINARY_DIR}/fusedoptConfigVersion.cmake
        DESTINATION ${fopt_package_dir})
